"""The Python snippets of clients/python/README.md run, as written, against a real server."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tests.integration.server import REPO_ROOT, ServerProcess

README = REPO_ROOT / "clients/python/README.md"
SNIPPET = re.compile(r"^( *)```python\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
SNIPPETS = [textwrap.dedent(match[2]) for match in SNIPPET.finditer(README.read_text())]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_readme_snippet_runs(server: ServerProcess, snippet: str) -> None:
    code = snippet.replace("localhost:8000", server.http_url)
    code = code.replace("localhost:8001", server.grpc_url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if "infer(" in snippet:
        assert "(4, 10)" in done.stdout
        assert "['logits', 'probabilities']" in done.stdout


def test_the_readme_has_snippets() -> None:
    assert len(SNIPPETS) == 2
