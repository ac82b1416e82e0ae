"""The container images, read by Docker's own parser (no Docker engine runs here): pinned,
non-root, one server process on the server's real ports, a health check on a real route."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import uvicorn
from batchserve.core.settings import Settings
from batchserve.dataplane.plane import DataPlane
from batchserve.models.repository import ModelRepository
from batchserve.rest.app import build_http_app
from deploy_support import DEPLOY, REPO, empty_registry, health_statuses, server_settings
from dockerfile_support import Stage, parse_dockerfile, run_commands, server_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DOCKER = DEPLOY / "docker"
PINNED_TAG = re.compile(r"^[\w.\-/]+:\d+\.\d+\.\d+[\w.\-]*$")
PIN_FILE_OPTIONS = ("-r", "--requirements", "--build-constraints")
DEV_ONLY = ("torch", "scikit-learn", "pytest", "hypothesis", "ruff", "mypy", "tritonclient")


@pytest.fixture(params=["cpu", "gpu"])
def variant(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def stages(variant: str) -> list[Stage]:
    return parse_dockerfile(DOCKER / f"Dockerfile.{variant}")


def _lock(name: str) -> dict[str, str]:
    """A requirements file as {canonical name: version}; every line must be ``==``-pinned."""
    pins: dict[str, str] = {}
    for line in (DOCKER / name).read_text().splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", f"{name}: {line} is not pinned"
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def _installs(stages: list[Stage]) -> list[list[str]]:
    """Every ``pip install`` (plain or ``uv pip install``) of every stage, as words."""
    commands = [words for stage in stages for words in run_commands(stage)]
    return [words for words in commands if " pip install " in f" {' '.join(words)} "]


def _option_values(words: list[str], *names: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words) if word in names]


def test_base_images_are_pinned_by_version(stages: list[Stage]) -> None:
    names = set()
    for stage in stages:
        if stage.image not in names:
            assert PINNED_TAG.match(stage.image), f"{stage.image} is not pinned to a version"
        names.add(stage.name)
        for copy in stage.all("COPY"):
            sources = [f.removeprefix("--from=") for f in copy.flags if f.startswith("--from=")]
            assert set(sources) <= names, f"{copy.original}: --from must name an earlier stage"


def test_image_runs_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    final = stages[-1]
    user = final.last("USER").value[0]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), f"USER {user} must be numeric uid:gid"
    uid, gid = user.split(":")
    commands = {words[0]: words for words in run_commands(final)}
    assert _option_values(commands["groupadd"], "--gid") == [gid]
    assert _option_values(commands["useradd"], "--uid", "--gid") == [uid, gid]


def test_every_install_is_pinned_and_resolves_nothing(variant: str, stages: list[Stage]) -> None:
    installs = _installs(stages)
    files = {name for words in installs for name in _option_values(words, *PIN_FILE_OPTIONS)}
    assert {f"requirements-{variant}.txt", "build-constraints.txt"} <= files
    for name in files:
        assert _lock(name), f"{name} pins nothing"
    for words in installs:
        assert "--no-deps" in words, f"{' '.join(words)} would resolve unpinned dependencies"
        after = words[words.index("install") + 1 :]
        targets = [w for w in after if not w.startswith("-") and w not in files]
        assert all(t == "." or "==" in t for t in targets), f"unpinned: {' '.join(words)}"
    uv_pip = [w for stage in stages for w in run_commands(stage) if w[:2] == ["uv", "pip"]]
    assert uv_pip[-1] == ["uv", "pip", "check"], "the installed set must be checked complete"


def test_locks_satisfy_pyproject_without_development_packages(variant: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lock = _lock(f"requirements-{variant}.txt")
    for line in [*project["dependencies"], *project["optional-dependencies"][variant]]:
        requirement = Requirement(line)
        version = lock.get(canonicalize_name(requirement.name))
        stale = f"requirements-{variant}.txt is stale: run deploy/docker/lock.py"
        assert version is not None, f"{stale} ({requirement.name} missing)"
        assert requirement.specifier.contains(version, prereleases=True), f"{stale} ({line})"
    assert not set(map(canonicalize_name, DEV_ONLY)) & lock.keys()


def test_the_project_is_installed_without_extras(stages: list[Stage]) -> None:
    local = [w for words in _installs(stages) for w in words if w.startswith(".")]
    assert local == ["."], "extras come from the lock file, never from pyproject"


def test_exposes_the_servers_default_ports(stages: list[Stage]) -> None:
    fields = Settings.model_fields
    defaults = {fields[f].default for f in ("http_port", "grpc_port", "metrics_port")}
    assert {int(port) for port in stages[-1].last("EXPOSE").value} == defaults


def test_entrypoint_runs_one_server_on_every_interface(
    stages: list[Stage], monkeypatch: pytest.MonkeyPatch
) -> None:
    final = stages[-1]
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint.json, "exec form: the server is PID 1 and receives SIGTERM itself"
    assert not final.all("CMD")
    command = list(entrypoint.value)
    assert command[:2] == ["batchserve", "serve"]
    assert command.count("batchserve") == 1
    settings = server_settings(command, server_env(final), monkeypatch)
    assert settings.host == "0.0.0.0"
    assert settings.model_repository == (Path("/models"),)


def test_a_repository_given_to_the_image_replaces_its_own(
    stages: list[Stage], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image names /models in a variable: one repository given as a flag is served
    instead of it, and two given are served together, as Triton serves them."""
    final = stages[-1]
    command = list(final.last("ENTRYPOINT").value)
    env = server_env(final)
    given = server_settings([*command, "--model-repository", "/srv/a"], env, monkeypatch)
    assert given.model_repository == (Path("/srv/a"),)
    both = [*command, "--model-repository=/srv/a", "--model-store", "/srv/b"]
    assert server_settings(both, env, monkeypatch).model_repository == (
        Path("/srv/a"),
        Path("/srv/b"),
    )


def test_model_repository_is_empty_unless_one_is_baked_in(stages: list[Stage]) -> None:
    final = stages[-1]
    [arg] = [a.value[0] for a in final.all("ARG") if a.value[0].startswith("MODEL_REPOSITORY=")]
    default = REPO / arg.split("=", 1)[1]
    assert ModelRepository(default).names() == []
    copies = [c.value for c in final.all("COPY") if c.value[0].startswith("${MODEL_REPOSITORY}")]
    assert copies == [("${MODEL_REPOSITORY}/", "/models/")]


def _healthcheck_script(final: Stage) -> Path:
    """The repository file the HEALTHCHECK runs, found through the COPY that put it there."""
    check = final.last("HEALTHCHECK")
    assert check.json
    assert check.value[0] == "CMD"
    in_image = check.value[-1]
    [source] = [str(c.value[0]) for c in final.all("COPY") if c.value[-1] == in_image]
    return REPO / source


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_healthcheck_asks_the_readiness_route(stages: list[Stage], tmp_path: Path) -> None:
    final = stages[-1]
    flags = dict(flag.lstrip("-").split("=") for flag in final.last("HEALTHCHECK").flags)
    assert flags["start-period"].endswith("m"), "models take minutes to load"
    path = _load(_healthcheck_script(final)).READY_PATH
    assert await health_statuses(path, tmp_path) == (200, 503)


@pytest.fixture
def running_server(tmp_path: Path) -> Iterator[tuple[int, DataPlane]]:
    """The real HTTP application served on a loopback port by uvicorn, in a thread."""
    settings = Settings(model_repository=tmp_path)
    dataplane = DataPlane(settings, empty_registry(tmp_path), [])
    config = uvicorn.Config(
        build_http_app(dataplane, settings), host="127.0.0.1", port=0, loop="asyncio",
        lifespan="off", log_config=None, access_log=False,
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    yield server.servers[0].sockets[0].getsockname()[1], dataplane
    server.should_exit = True
    thread.join(timeout=10)


def _probe(script: Path, port: int) -> int:
    # A proxy that refuses every connection: the probe must go straight to the server.
    env = os.environ | {"BATCHSERVE_HTTP_PORT": str(port), "http_proxy": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True).returncode


@pytest.mark.integration
def test_healthcheck_script_follows_the_servers_readiness(
    running_server: tuple[int, DataPlane],
) -> None:
    script = _healthcheck_script(parse_dockerfile(DOCKER / "Dockerfile.cpu")[-1])
    port, dataplane = running_server
    assert _probe(script, port) == 0
    dataplane.draining = True
    assert _probe(script, port) == 1


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, simplified: the last matching pattern (or its ``!`` negation)
    on the path or any parent directory decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if any(fnmatch.fnmatch(p, pattern.lstrip("!").strip("/")) for p in prefixes):
            verdict = not negated
    return verdict


def test_dockerignore_keeps_what_the_build_copies(stages: list[Stage]) -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for name in (".git", ".venv", "tests", "server/batchserve/__pycache__"):
        assert _ignored(name, patterns), f".dockerignore should exclude {name}"
    assert not _ignored("model_repo", patterns), "the examples can be baked in"
    copies = [c for stage in stages for c in stage.all("COPY") if not c.flags]
    sources = [s for c in copies for s in c.value[:-1] if not s.startswith("$")]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is excluded by .dockerignore"
