import shutil
from collections.abc import Iterator

import pytest

from tests.integration.server import CONTROL_TOKEN, MODEL_REPO, ServerProcess, start_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def shipped_server() -> Iterator[ServerProcess]:
    """One real server on loopback serving the shipped model repository."""
    process = start_server()
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="session")
def server(shipped_server: ServerProcess) -> ServerProcess:
    return shipped_server


@pytest.fixture(scope="session")
def shipped_server_with_workers() -> Iterator[ServerProcess]:
    """The same, its requests handled by two workers."""
    process = start_server(extra_args=["--workers", "2"])
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="session", params=["one-process", "two-workers"])
def server_either_way(request: pytest.FixtureRequest) -> ServerProcess:
    """The shipped repository served by one process, then by two workers: for the modules
    whose promises (bad input, limits, the protocol) must hold alike for both."""
    name = "shipped_server" if request.param == "one-process" else "shipped_server_with_workers"
    served: ServerProcess = request.getfixturevalue(name)
    return served


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def explicit_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """Model control on with a token: digits_cnn loaded at start, char_lstm on request; by
    one process, and by two workers that forward control to the model-owning process."""
    repo = tmp_path_factory.mktemp("control_repo")
    for name in ("digits_cnn", "char_lstm"):
        shutil.copytree(MODEL_REPO / name, repo / name)
    args = ["--model-control-mode", "explicit", "--load-model", "digits_cnn",
            "--workers", request.param]  # fmt: skip
    server = start_server(repo, args, extra_env={"BATCHSERVE_CONTROL_TOKEN": CONTROL_TOKEN})
    yield server
    assert server.stop() == 0
