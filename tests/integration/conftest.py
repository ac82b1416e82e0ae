from collections.abc import Iterator

import pytest

from tests.integration.server import ServerProcess, start_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """One real server on loopback serving the shipped model repository."""
    process = start_server()
    yield process
    assert process.stop() == 0
