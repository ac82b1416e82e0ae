"""The region manager over real POSIX shared-memory objects: names, bounds, truncation,
counts, and Triton's register/unregister/status semantics."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from batchserve.core.datatypes import from_wire
from batchserve.core.errors import AlreadyExists, Internal, InvalidArgument, NotFound
from batchserve.core.types import InferRequest, RequestedOutput, Tensor
from batchserve.dataplane.shared_memory import parameters
from batchserve.dataplane.shared_memory import tensors as shm
from batchserve.dataplane.shared_memory.manager import Region, RegionStatus, SharedMemoryManager
from batchserve.dataplane.shared_memory.system import SHM_DIR, SystemRegion, object_name

MakeObject = Callable[[int], str]


@pytest.fixture
def shm_object() -> Iterator[MakeObject]:
    """Objects made as a client makes them (a file under SHM_DIR, as shm_open does), filled
    with 0, 1, 2, ...; returns the key ("/name")."""
    made: list[str] = []

    def make(size: int) -> str:
        name = f"bstest_{uuid.uuid4().hex[:12]}"
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(i % 256 for i in range(size)))
        finally:
            os.close(fd)
        made.append(name)
        return "/" + name

    yield make
    for name in made:
        if os.path.exists(os.path.join(SHM_DIR, name)):
            os.unlink(os.path.join(SHM_DIR, name))


def truncate(key: str, size: int) -> None:
    os.truncate(os.path.join(SHM_DIR, key.lstrip("/")), size)


@pytest.fixture
def manager() -> Iterator[SharedMemoryManager]:
    regions = SharedMemoryManager(max_regions=4)
    yield regions
    regions.close()


# keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["/input_simple", "input_simple", "//input_simple"])
def test_keys_name_one_object(key: str) -> None:
    assert object_name("r", key) == "input_simple"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("/", "invalid shm key '/'"),
        ("", "invalid shm key ''"),
        ("/../etc/passwd", "invalid shm key '/../etc/passwd'"),
        ("/a/b", "invalid shm key '/a/b'"),
        ("/..", "invalid shm key '/..'"),
        ("/a\0b", "invalid shm key"),
        ("/" + "x" * 256, "at most 255 characters"),
        ("/triton_python_backend_shm_region_1", "contains the reserved prefix"),
    ],
)
def test_keys_that_are_not_plain_names_are_refused(key: str, problem: str) -> None:
    with pytest.raises(InvalidArgument, match=f"region 'r'.*{problem}"):
        object_name("r", key)


def test_an_object_that_does_not_exist_is_refused(manager: SharedMemoryManager) -> None:
    with pytest.raises(InvalidArgument, match="Unable to open shared memory region: '/nope_"):
        manager.register_system("r", f"/nope_{uuid.uuid4().hex}", 0, 8)
    assert len(manager) == 0


def test_a_symlink_is_not_followed(manager: SharedMemoryManager, shm_object: MakeObject) -> None:
    target = shm_object(64)
    link = f"bstest_link_{uuid.uuid4().hex[:8]}"
    os.symlink(os.path.join(SHM_DIR, target[1:]), os.path.join(SHM_DIR, link))
    try:
        with pytest.raises(InvalidArgument, match="Unable to open shared memory region"):
            manager.register_system("r", "/" + link, 0, 8)
    finally:
        os.unlink(os.path.join(SHM_DIR, link))


# registration ----------------------------------------------------------------------


def test_region_past_the_object_is_refused(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(64)
    with pytest.raises(InvalidArgument, match="failed to register shared memory region 'r': "):
        manager.register_system("r", key, 32, 33)
    manager.register_system("r", key, 32, 32)
    assert manager.status("system") == [RegionStatus("r", 32, key, 32)]


def test_duplicate_names_are_refused_whatever_the_kind(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(16)
    manager.register_system("r", key, 0, 16)
    with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
        manager.register_system("r", key, 0, 8)
    with pytest.raises(AlreadyExists):
        manager.register_cuda("r", b"\0" * 64, 0, 8)


def test_the_number_of_regions_is_bounded(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(16)
    for index in range(4):
        manager.register_system(f"r{index}", key, 0, 16)
    with pytest.raises(InvalidArgument, match="4 regions are registered already"):
        manager.register_system("r4", key, 0, 16)
    manager.unregister("system", "r0")
    manager.register_system("r4", key, 0, 16)


def test_an_empty_name_is_refused(manager: SharedMemoryManager, shm_object: MakeObject) -> None:
    with pytest.raises(InvalidArgument, match="'region name' is necessary"):
        manager.register_system("", shm_object(8), 0, 8)


# status and unregister -------------------------------------------------------------


def test_status_and_unregister_follow_triton(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    manager.register_system("b", shm_object(8), 4, 4)
    manager.register_system("a", shm_object(8), 0, 8)
    assert [row.name for row in manager.status("system")] == ["a", "b"]  # by name
    assert manager.status("cuda") == []
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'c'"):
        manager.status("system", "c")
    with pytest.raises(NotFound, match="Unable to find cuda shared memory region: 'c'"):
        manager.status("cuda", "c")
    with pytest.raises(NotFound, match="'a' is registered as system shared memory, not CUDA"):
        manager.status("cuda", "a")
    manager.unregister("cuda", "a")  # the other kind: nothing happens, as in Triton
    manager.unregister("system", "unknown")  # unknown: nothing happens either
    assert len(manager) == 2
    manager.unregister("system", "a")
    assert [row.name for row in manager.status("system")] == ["b"]
    manager.unregister("system")
    assert len(manager) == 0


def test_a_failed_close_is_reported_and_the_region_still_goes(
    manager: SharedMemoryManager, shm_object: MakeObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager.register_system("a", shm_object(8), 0, 8)

    def fail() -> None:
        raise OSError("closing failed")

    region = manager.region("a", 0, 8)
    assert isinstance(region, SystemRegion)
    monkeypatch.setattr(region, "close", fail)
    with pytest.raises(Internal, match=r"Failed to unregister the following system .*: a"):
        manager.unregister("system")
    assert len(manager) == 0


# access ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "size", "problem"),
    [
        (16, 0, "Invalid offset for shared memory region: 'r'"),
        (99, 1, "Invalid offset for shared memory region: 'r'"),
        (8, 9, r"Invalid offset \+ byte size for shared memory region: 'r'"),
        (0, 17, r"Invalid offset \+ byte size"),
        (  # a sum a C size_t could not hold, refused before it is compared (Triton's words)
            8,
            2**64 - 8,
            r"Integer overflow detected: byte_size \(18446744073709551608\) \+ offset \(8\) "
            r"exceeds maximum value \(18446744073709551615\) for region 'r'",
        ),
    ],
)
def test_every_access_is_checked_against_the_region(
    manager: SharedMemoryManager, shm_object: MakeObject, offset: int, size: int, problem: str
) -> None:
    manager.register_system("r", shm_object(64), 8, 16)
    with pytest.raises(InvalidArgument, match=problem):
        manager.region("r", offset, size)
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'q'"):
        manager.region("q", 0, 1)


def test_reads_and_writes_land_at_the_region_offset(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(64)
    manager.register_system("r", key, 8, 16)
    region = manager.region("r", 4, 4)
    assert region.read(4, 4, "x") == bytes([12, 13, 14, 15])
    region.write(4, b"\xff\xfe", "x")
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as file:
        assert file.read()[10:16] == bytes([10, 11, 0xFF, 0xFE, 14, 15])


def test_a_truncated_object_is_an_error_not_a_signal(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(64)
    manager.register_system("r", key, 0, 64)
    truncate(key, 10)
    region = manager.region("r", 0, 64)
    with pytest.raises(InvalidArgument, match=r"tensor 'x': .*'r'.*truncated to 10 bytes"):
        region.read(0, 64, "x")
    with pytest.raises(InvalidArgument, match="truncated to 10 bytes"):
        region.write(8, b"\0" * 8, "y")
    assert region.read(0, 10, "x") == bytes(range(10))


def test_an_unlinked_object_stays_readable(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(8)
    manager.register_system("r", key, 0, 8)
    os.unlink(os.path.join(SHM_DIR, key[1:]))
    assert manager.region("r", 0, 8).read(0, 8, "x") == bytes(range(8))


def test_unregistering_closes_the_descriptor(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    before = len(os.listdir("/proc/self/fd"))
    manager.register_system("r", shm_object(8), 0, 8)
    assert len(os.listdir("/proc/self/fd")) == before + 1
    manager.unregister("system", "r")
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_region_unregistered_while_held_waits_for_its_last_request(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    """Triton's ``awaiting_unregister_``: the unregister succeeds, the region stays listed,
    usable and its name taken until the last request holding it ends; then it is gone."""
    manager.register_system("r", shm_object(64), 0, 64)
    manager.register_system("free", shm_object(8), 0, 8)
    manager.hold(["r"])
    manager.hold(["r"])
    manager.unregister("system")
    assert [row.name for row in manager.status("system")] == ["r"]  # "free" went at once
    assert manager.region("r", 0, 8).read(0, 8, "x") == bytes(range(8))
    with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
        manager.register_system("r", shm_object(8), 0, 8)
    manager.release(["r"])
    assert len(manager) == 1
    manager.release(["r"])
    assert len(manager) == 0
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'r'"):
        manager.region("r", 0, 8)


def test_a_hold_released_without_an_unregister_leaves_the_region_registered(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    manager.register_system("r", shm_object(8), 0, 8)
    manager.hold(["r", "r"])  # a request naming it twice (an input and an output)
    manager.release(["r", "r"])
    assert len(manager) == 1
    manager.unregister("system", "r")  # nothing holds it now: at once
    assert len(manager) == 0


def test_a_request_holds_its_regions_until_it_is_gone(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    """However a request ends, dropping it releases its regions: no path can leak a hold."""
    manager.register_system("in", shm_object(16), 0, 16)
    manager.register_system("out", shm_object(16), 0, 16)
    int32 = from_wire("INT32", tensor="a")
    params = _placed("a", "in", 16)
    placeholder = parameters.placeholder(params, False, int32, (1, 4), "a")
    assert placeholder is not None
    request = InferRequest(
        "m",
        inputs=[Tensor("a", int32, (1, 4), placeholder, params)],
        outputs=[RequestedOutput("b", parameters=_placed("b", "out", 16))],
    )
    shm.read_inputs(request, manager, {"a"})
    shm.check_outputs(request, manager)
    shm.hold_while_in_flight(request, manager)
    manager.unregister("system")
    assert sorted(row.name for row in manager.status("system")) == ["in", "out"]
    del request
    assert len(manager) == 0


# tensors -----------------------------------------------------------------------------


def _placed(name: str, region: str, size: int, offset: int = 0) -> dict[str, object]:
    params: dict[str, object] = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset:
        params["shared_memory_offset"] = offset
    return params


def test_inputs_are_copied_out_of_their_regions(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(32)
    manager.register_system("in", key, 0, 32)
    int32 = from_wire("INT32", tensor="a")
    params = _placed("a", "in", 16, offset=16)
    placeholder = parameters.placeholder(params, False, int32, (1, 4), "a")
    assert placeholder is not None
    request = InferRequest("m", inputs=[Tensor("a", int32, (1, 4), placeholder, params)])
    shm.read_inputs(request, manager, {"a"})
    expected = np.frombuffer(bytes(range(16, 32)), "<i4").reshape(1, 4)
    np.testing.assert_array_equal(request.inputs[0].data, expected)
    truncate(key, 0)  # the copy does not change with the region
    np.testing.assert_array_equal(request.inputs[0].data, expected)


def test_a_region_size_that_does_not_match_the_shape_is_refused(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    manager.register_system("in", shm_object(32), 0, 32)
    int32 = from_wire("INT32", tensor="a")
    params = _placed("a", "in", 12)
    placeholder = parameters.placeholder(params, False, int32, (1, 4), "a")
    assert placeholder is not None
    request = InferRequest("m", inputs=[Tensor("a", int32, (1, 4), placeholder, params)])
    with pytest.raises(
        InvalidArgument,
        match=r"^input byte size mismatch for input 'a' for model 'm'. Expected 16, got 12",
    ):
        shm.read_inputs(request, manager, {"a"})


def test_outputs_are_written_and_marked(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    key = shm_object(64)
    manager.register_system("out", key, 0, 64)
    data = np.array([[b"ab", b""]], dtype=object)
    output = Tensor("y", from_wire("BYTES", tensor="y"), (1, 2), data)
    placements = shm.output_placements([RequestedOutput("y", parameters=_placed("y", "out", 64))])
    shm.write_outputs([output], placements, manager)
    assert output.in_shared_memory
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as file:
        assert file.read(14) == b"\2\0\0\0ab\0\0\0\0" + bytes([10, 11, 12, 13])


def test_an_output_larger_than_its_region_is_refused(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    manager.register_system("out", shm_object(64), 0, 64)
    output = Tensor("y", from_wire("FP32", tensor="y"), (1, 4), np.zeros((1, 4), np.float32))
    placements = shm.output_placements([RequestedOutput("y", parameters=_placed("y", "out", 8))])
    with pytest.raises(
        InvalidArgument,
        match=r"output 'y' \(8 bytes\) should be at least 16 bytes to hold the results",
    ):
        shm.write_outputs([output], placements, manager)
    assert not output.in_shared_memory


def test_an_output_region_unregistered_mid_request_fails_that_request(
    manager: SharedMemoryManager, shm_object: MakeObject
) -> None:
    manager.register_system("out", shm_object(64), 0, 64)
    request = InferRequest("m", outputs=[RequestedOutput("y", parameters=_placed("y", "out", 16))])
    shm.check_outputs(request, manager)
    manager.unregister("system", "out")
    output = Tensor("y", from_wire("FP32", tensor="y"), (1, 4), np.zeros((1, 4), np.float32))
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'out'"):
        shm.write_outputs([output], shm.output_placements(request.outputs), manager)


def test_cuda_regions_are_refused_clearly_without_a_gpu(manager: SharedMemoryManager) -> None:
    from batchserve.devices import placement as devices

    if devices.gpu_count():
        pytest.skip("this machine has a GPU: tests/unit/shared_memory/test_cuda_ipc.py runs")
    with pytest.raises(
        InvalidArgument,
        match="failed to register CUDA shared memory region: 'g', GPUs not supported; "
        "CUDA shared memory needs a GPU: ",
    ):
        manager.register_cuda("g", b"\0" * 64, 0, 8)
    with pytest.raises(InvalidArgument, match="must be a valid base64 encoded cudaIpcMemHandle_t"):
        manager.register_cuda("g", b"\0" * 63, 0, 8)
    assert len(manager) == 0


class _CountingManager(SharedMemoryManager):
    """A manager that counts the regions looked up, to prove nothing was read."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def region(self, name: str, offset: int, byte_size: int) -> Region:
        self.lookups += 1
        return super().region(name, offset, byte_size)


def test_nothing_is_read_for_an_input_the_model_lacks_or_a_size_its_shape_contradicts(
    shm_object: MakeObject,
) -> None:
    """A region is read only once every placed input is the model's and sized by its shape:
    a small request may not make the server read gigabytes it will then refuse."""
    manager = _CountingManager()
    manager.register_system("in", shm_object(64), 0, 64)
    int32 = from_wire("INT32", tensor="a")

    def request(name: str, size: int) -> InferRequest:
        params = _placed(name, "in", size)
        data = parameters.placeholder(params, False, int32, (1, 4), name)
        assert data is not None
        good = _placed("a", "in", 16)
        good_data = parameters.placeholder(good, False, int32, (1, 4), "a")
        assert good_data is not None
        return InferRequest(
            "m",
            inputs=[
                Tensor("a", int32, (1, 4), good_data, good),
                Tensor(name, int32, (1, 4), data, params),
            ],
        )

    with pytest.raises(InvalidArgument, match=r"^unexpected inference input 'b' for model 'm'"):
        shm.read_inputs(request("b", 16), manager, {"a"})
    with pytest.raises(InvalidArgument, match=r"^input byte size mismatch for input 'c'"):
        shm.read_inputs(request("c", 64), manager, {"a", "c"})
    assert manager.lookups == 0
    shm.read_inputs(request("c", 16), manager, {"a", "c"})
    assert manager.lookups == 2
