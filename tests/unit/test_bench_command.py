"""The benchmark's command line as RESULTS.md records it."""

from __future__ import annotations

from bench.common import ROOT
from bench.run import public_words


def test_paths_outside_the_repository_become_placeholders() -> None:
    words = ["--peers", "/somewhere/peers", "--out=/elsewhere/R.md", "--quick"]
    assert public_words(words) == ["--peers", "PEERS", "--out=OUT", "--quick"]


def test_paths_inside_the_repository_are_shown_relative_to_it() -> None:
    words = ["--model-repository", str(ROOT / "model_repo"), "--models", "digits_cnn"]
    assert public_words(words) == ["--model-repository", "model_repo", "--models", "digits_cnn"]
    assert public_words(["--out", str(ROOT / "bench" / "R.md")]) == ["--out", "bench/R.md"]
