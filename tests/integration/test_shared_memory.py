"""System and CUDA shared memory with NVIDIA's real tritonclient, over HTTP and gRPC: what the
``simple_*_shm_*`` examples do, what a hostile or careless client does, and perf_analyzer."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.integration.server import (
    PERF_ANALYZER,
    ServerProcess,
    run_perf_analyzer,
    start_server,
)
from tests.integration.shm_models import write_simple_models
from tests.integration.slow_model import write_slow_model

PROTOCOLS = ["http", "grpc"]
INT32_BYTES = 16 * 4


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def shm_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """Served by one process, and by two workers (``--workers``): regions registered through
    one worker are named in requests through the other; the model-owning process reads them."""
    repo = write_simple_models(tmp_path_factory.mktemp("shm_repo"))
    write_slow_model(repo, "slow", max_queue_size=8)
    # the default admits clients on this host, as these are
    server = start_server(repo, ["--workers", request.param])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def closed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = write_simple_models(tmp_path_factory.mktemp("closed_repo"))
    server = start_server(repo, ["--allow-client-shm=false"])
    yield server
    assert server.stop() == 0


def _outward_address() -> str | None:
    """An address of this host other than loopback, where it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server listening on every address, with the default --allow-client-shm (local)."""
    repo = write_simple_models(tmp_path_factory.mktemp("open_repo"))
    server = start_server(repo, ["--host", "0.0.0.0"])
    yield server
    assert server.stop() == 0


def client(server: ServerProcess, protocol: str, host: str = "127.0.0.1") -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(f"{host}:{server.http_port}")
    return grpcclient.InferenceServerClient(f"{host}:{server.grpc_port}")


def module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


@pytest.fixture
def regions() -> Iterator[list[Any]]:
    """Client-side regions made in a test, destroyed after it (and its server-side names)."""
    made: list[Any] = []
    yield made
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def region(made: list[Any], name: str, size: int) -> tuple[Any, str]:
    key = f"/bs_{name}_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, key, size)
    made.append(handle)
    return handle, key


@pytest.fixture(autouse=True)
def _nothing_registered(shm_server: ServerProcess) -> Iterator[None]:
    yield
    for protocol in PROTOCOLS:
        client(shm_server, protocol).unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_shared_memory_is_refused_when_turned_off_as_in_triton(
    closed_server: ServerProcess, protocol: str
) -> None:
    triton = client(closed_server, protocol)
    disabled = (
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
        "to enable."
    )
    calls = (
        lambda: triton.register_system_shared_memory("r", "/k", 8),
        triton.unregister_system_shared_memory,
        triton.unregister_cuda_shared_memory,
    )
    forbidden = "403" if protocol == "http" else "StatusCode.PERMISSION_DENIED"
    for call in calls:
        assert _refused(call, disabled).status() == forbidden
    assert len(triton.get_system_shared_memory_status(**_as_json(protocol))) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_by_default_only_clients_on_this_host_may_use_shared_memory(
    open_server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    """A client reaching the server over a non-loopback address cannot share memory with it,
    so it may neither register regions, nor see them, nor name one in a request; the same
    server serves a loopback client's regions."""
    address = _outward_address()
    if address is None:
        pytest.skip("this host has no address other than loopback")
    remote, local = client(open_server, protocol, address), client(open_server, protocol)
    disabled = ("Client shared memory is disabled", "only clients on this host", address)
    _refused(lambda: remote.register_system_shared_memory("r", "/k", 8), *disabled)
    handle, key = region(regions, "shared_in", INT32_BYTES)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    local.register_system_shared_memory("shared_in", key, INT32_BYTES)
    try:
        assert len(local.get_system_shared_memory_status(**_as_json(protocol))) == 1
        assert len(remote.get_system_shared_memory_status(**_as_json(protocol))) == 0
        mod = module(protocol)
        _refused(
            lambda: remote.infer("simple", _simple_inputs(mod, "shared_in", INT32_BYTES)),
            *disabled,
        )
        answer = local.infer("simple", _simple_inputs(mod, "shared_in", INT32_BYTES))
        assert answer.as_numpy("OUTPUT0").tolist() == [list(range(0, 32, 2))]
    finally:
        local.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_simple_shm_example(
    shm_server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    """simple_{http,grpc}_shm_client.py: two inputs in one region, two outputs in another."""
    triton, mod = client(shm_server, protocol), module(protocol)
    triton.unregister_system_shared_memory()
    triton.unregister_cuda_shared_memory()  # what the example does first; no GPU needed
    in0, in1 = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    out, out_key = region(regions, "output_data", INT32_BYTES * 2)
    triton.register_system_shared_memory("output_data", out_key, INT32_BYTES * 2)
    ins, in_key = region(regions, "input_data", INT32_BYTES * 2)
    shm.set_shared_memory_region(ins, [in0])
    shm.set_shared_memory_region(ins, [in1], offset=INT32_BYTES)
    triton.register_system_shared_memory("input_data", in_key, INT32_BYTES * 2)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_data", INT32_BYTES)
    inputs[1].set_shared_memory("input_data", INT32_BYTES, offset=INT32_BYTES)
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", INT32_BYTES)
    outputs[1].set_shared_memory("output_data", INT32_BYTES, offset=INT32_BYTES)

    result = triton.infer("simple", inputs, outputs=outputs)

    output0, output1 = result.get_output("OUTPUT0"), result.get_output("OUTPUT1")
    if protocol == "http":
        # no data and no binary part: the data is in the region
        assert output0 == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    else:
        assert (output0.datatype, list(output0.shape)) == ("INT32", [1, 16])
        assert list(result.get_response().raw_output_contents) == [b"", b""]
    assert output1 is not None
    got0 = shm.get_contents_as_numpy(out, np.int32, [1, 16])
    got1 = shm.get_contents_as_numpy(out, np.int32, [1, 16], offset=INT32_BYTES)
    np.testing.assert_array_equal(got0[0], in0 + in1)
    np.testing.assert_array_equal(got1[0], in0 - in1)
    status = triton.get_system_shared_memory_status()
    if protocol == "http":
        assert sorted(status, key=lambda row: row["name"]) == [
            {"name": "input_data", "key": in_key, "offset": 0, "byte_size": 128},
            {"name": "output_data", "key": out_key, "offset": 0, "byte_size": 128},
        ]
    else:
        assert sorted(status.regions) == ["input_data", "output_data"]
        assert status.regions["input_data"].key == in_key
        assert status.regions["input_data"].byte_size == 128
    triton.unregister_system_shared_memory()
    assert len(triton.get_system_shared_memory_status(**_as_json(protocol))) == 0


def _as_json(protocol: str) -> dict[str, bool]:
    return {"as_json": True} if protocol == "grpc" else {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_simple_shm_string_example(
    shm_server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    """simple_{http,grpc}_shm_string_client.py: BYTES tensors in and out of regions give
    what the same tensors sent in the request give."""
    triton, mod = client(shm_server, protocol), module(protocol)
    in0, in1 = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)

    def strings(values: np.ndarray) -> np.ndarray:
        return np.array([str(v).encode() for v in values], dtype=object).reshape(1, 16)

    out_size = 256
    handles = {}
    for name in ("output0_data", "output1_data"):
        handles[name], key = region(regions, name, out_size)
        triton.register_system_shared_memory(name, key, out_size)
    sizes = {}
    for name, values in (("input0_data", in0), ("input1_data", in1)):
        data = serialize_byte_tensor(strings(values))
        sizes[name] = len(data.item())
        handle, key = region(regions, name, sizes[name])
        shm.set_shared_memory_region(handle, [data])
        triton.register_system_shared_memory(name, key, sizes[name])
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "BYTES"),
        mod.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_shared_memory("input0_data", sizes["input0_data"])
    inputs[1].set_shared_memory("input1_data", sizes["input1_data"])
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", out_size)
    outputs[1].set_shared_memory("output1_data", out_size)

    triton.infer("simple_string", inputs, outputs=outputs)

    plain = [mod.InferInput("INPUT0", [1, 16], "BYTES"), mod.InferInput("INPUT1", [1, 16], "BYTES")]
    plain[0].set_data_from_numpy(strings(in0))
    plain[1].set_data_from_numpy(strings(in1))
    expected = triton.infer("simple_string", plain)
    for index, name in enumerate(("output0_data", "output1_data")):
        got = shm.get_contents_as_numpy(handles[name], np.object_, [1, 16])
        assert list(got[0]) == list(expected.as_numpy(f"OUTPUT{index}")[0])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_inputs_in_shared_memory_and_outputs_in_the_response(
    shm_server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    """One input in a region, one sent as bytes: gRPC's raw_input_contents then holds only
    the second (as Triton reads it); outputs come back as usual."""
    triton, mod = client(shm_server, protocol), module(protocol)
    in0, in1 = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, np.int32)
    handle, key = region(regions, "in0", INT32_BYTES)
    shm.set_shared_memory_region(handle, [in0])
    triton.register_system_shared_memory("in0", key, INT32_BYTES)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("in0", INT32_BYTES)
    inputs[1].set_data_from_numpy(in1)

    result = triton.infer("simple", inputs)

    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)


def _simple_inputs(mod: Any, region_name: str, size: int, offset: int = 0) -> list[Any]:
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_shared_memory(region_name, size, offset=offset)
    return inputs


def _refused(call: Any, *fragments: str) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    message = str(caught.value.message())
    for fragment in fragments:
        assert fragment in message, message
    return caught.value


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hostile_requests_are_refused_and_the_server_carries_on(
    shm_server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    triton, mod = client(shm_server, protocol), module(protocol)
    handle, key = region(regions, "in", INT32_BYTES * 2)
    shm.set_shared_memory_region(handle, [np.arange(32, dtype=np.int32)])
    triton.register_system_shared_memory("in", key, INT32_BYTES * 2)

    duplicate = _refused(
        lambda: triton.register_system_shared_memory("in", key, 8),
        "shared memory region 'in' already in manager",
    )
    assert duplicate.status() == ("400" if protocol == "http" else "StatusCode.ALREADY_EXISTS")
    _refused(
        lambda: triton.register_system_shared_memory("big", key, INT32_BYTES * 2 + 1),
        "failed to register shared memory region 'big': invalid args",
    )
    _refused(
        lambda: triton.register_system_shared_memory("t", "/../../etc/passwd", 8),
        "cannot register shared memory region 't' - invalid shm key '/../../etc/passwd'",
    )
    _refused(
        lambda: triton.register_system_shared_memory("n", f"/none_{uuid.uuid4().hex}", 8),
        "Unable to open shared memory region: '/none_",
    )
    _refused(
        lambda: triton.infer("simple", _simple_inputs(mod, "in", INT32_BYTES, offset=128)),
        "Invalid offset for shared memory region: 'in'",
    )
    _refused(
        lambda: triton.infer("simple", _simple_inputs(mod, "in", INT32_BYTES, offset=100)),
        "Invalid offset + byte size for shared memory region: 'in'",
    )
    _refused(
        lambda: triton.infer("simple", _simple_inputs(mod, "in", INT32_BYTES - 4)),
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
    )
    _refused(
        lambda: triton.infer("simple", _simple_inputs(mod, "nowhere", INT32_BYTES)),
        "Unable to find shared memory region: 'nowhere'",
    )
    _refused(
        lambda: triton.get_system_shared_memory_status("nowhere"),
        "Unable to find system shared memory region: 'nowhere'",
    )
    small = mod.InferRequestedOutput("OUTPUT0")
    small.set_shared_memory("in", 8)
    _refused(
        lambda: triton.infer("simple", _simple_inputs(mod, "in", INT32_BYTES), outputs=[small]),
        "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
        "should be at least 64 bytes to hold the results",
    )

    os.truncate(f"/dev/shm/{key.lstrip('/')}", 10)  # the client shrinks its object
    _refused(
        lambda: triton.infer("simple", _simple_inputs(mod, "in", INT32_BYTES)),
        "tensor 'INPUT0': shared memory region 'in'",
        "was truncated to 10 bytes",
    )
    assert triton.is_server_live()
    result = triton.infer("simple", _plain_inputs(mod))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))


def _plain_inputs(mod: Any) -> list[Any]:
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def test_http_offsets_and_sizes_past_int64_get_the_regions_check_in_tritons_words(
    shm_server: ServerProcess, regions: list[Any]
) -> None:
    """HTTP carries offsets and sizes as JSON unsigned 64-bit integers, as Triton reads them,
    and Triton's shared-memory tests send 2**64 - 32 to find a wrapped sum: the region's
    check answers, in the words those tests read, and the server carries on."""
    triton = client(shm_server, "http")
    handle, key = region(regions, "out", INT32_BYTES)
    triton.register_system_shared_memory("out", key, INT32_BYTES)

    def infer_into(size: int, offset: int) -> Any:
        output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        output.set_shared_memory("out", size, offset=offset)
        return triton.infer("simple", _plain_inputs(httpclient), outputs=[output])

    _refused(lambda: infer_into(INT32_BYTES, 2**64 - 32),
             "Invalid offset for shared memory region: 'out'")  # fmt: skip
    overflow = _refused(
        lambda: infer_into(2**64 - 32, 32),
        "Integer overflow detected: byte_size (18446744073709551584) + offset (32) exceeds "
        "maximum value (18446744073709551615) for region 'out'",
    )
    assert overflow.status() == "400"
    _refused(lambda: infer_into(INT32_BYTES, 2**64), "invalid value for 'shared_memory_offset'")
    infer_into(INT32_BYTES, 0)
    written = shm.get_contents_as_numpy(handle, np.int32, [1, 16])
    np.testing.assert_array_equal(written, np.full((1, 16), 2, np.int32))  # ones + ones


def test_http_register_bodies_are_checked(shm_server: ServerProcess) -> None:
    import requests

    base = f"http://127.0.0.1:{shm_server.http_port}/v2/systemsharedmemory/region/r/register"
    for body, problem in (
        (b'{"byte_size": 8}', "Shared memory register request has no 'key' field"),
        (b'{"key": "/x"}', "Shared memory register request has no 'byte_size' field"),
        (b'{"key": "/x", "byte_size": -1}', "'byte_size' must be an integer >= 0, got -1"),
        (b'{"key": 3, "byte_size": 1}', "'key' must be a string, got 3"),
        (b"[1]", "must be a JSON object"),
        (b"{" * 70_000, "is over the limit of 65536 bytes"),
    ):
        answer = requests.post(base, data=body, timeout=10)
        assert answer.status_code in (400, 413), answer.text
        assert problem in answer.json()["error"]
    nameless = base.replace("/region/r", "")
    answer = requests.post(nameless, data=b'{"key": "/x", "byte_size": 8}', timeout=10)
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "'region name' is necessary to register system shared memory region"
    )
    answer = requests.get(base.replace("register", "status"), timeout=10)
    assert answer.status_code == 404


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_shared_memory_is_refused_clearly_without_a_gpu(
    shm_server: ServerProcess, protocol: str
) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has a GPU: tests/unit/shared_memory/test_cuda_ipc.py runs")
    triton = client(shm_server, protocol)
    import base64

    raw = base64.b64encode(b"\0" * 64)  # both clients take it base64-encoded
    _refused(
        lambda: triton.register_cuda_shared_memory("gpu", raw, 0, 64),
        "failed to register CUDA shared memory region: 'gpu', GPUs not supported; "
        "CUDA shared memory needs a GPU: ",
    )
    status = triton.get_cuda_shared_memory_status(**_as_json(protocol))
    assert len(status if protocol == "http" else status.get("regions", {})) == 0
    triton.unregister_cuda_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unregistering_regions_a_request_uses_waits_for_it_as_in_triton(
    shm_server: ServerProcess, regions: list[Any], protocol: str
) -> None:
    """Triton's L0_shared_memory (TestSharedMemoryUnregister): regions unregistered while a
    request that names them runs stay listed and usable, the request gets its output
    written, and they are gone once it ends, without unregistering again."""
    triton, mod = client(shm_server, protocol), module(protocol)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    handle, key = region(regions, "x", 16)
    shm.set_shared_memory_region(handle, [x])
    triton.register_system_shared_memory("x", key, 16)
    out_handle, out_key = region(regions, "y", 16)
    triton.register_system_shared_memory("y", out_key, 16)
    inputs = [mod.InferInput("x", [1, 4], "FP32"), mod.InferInput("iterations", [1, 1], "INT64")]
    inputs[0].set_shared_memory("x", 16)
    inputs[1].set_data_from_numpy(np.array([[400]], dtype=np.int64))  # 1-4 s of work
    output = mod.InferRequestedOutput("y")
    output.set_shared_memory("y", 16)
    errors: list[str] = []

    def run() -> None:
        try:
            triton_in_thread = client(shm_server, protocol)
            triton_in_thread.infer("slow", inputs, outputs=[output])
        except InferenceServerException as error:
            errors.append(str(error.message()))

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    triton.unregister_system_shared_memory()  # both, while the request runs: no error
    listed = triton.get_system_shared_memory_status()
    names = sorted(row["name"] for row in listed) if protocol == "http" else sorted(listed.regions)
    worker.join(30)
    assert not worker.is_alive()
    assert errors == []
    assert names == ["x", "y"]  # still listed while the request held them
    written = shm.get_contents_as_numpy(out_handle, np.float32, [1, 4])
    np.testing.assert_allclose(written, x + x.sum() / 512)
    _refused(lambda: triton.get_system_shared_memory_status("y"),
             "Unable to find system shared memory region: 'y'")  # fmt: skip
    assert len(triton.get_system_shared_memory_status(**_as_json(protocol))) == 0


def test_statistics_count_shared_memory_requests(
    shm_server: ServerProcess, regions: list[Any]
) -> None:
    triton = client(shm_server, "http")
    before = triton.get_inference_statistics("simple")["model_stats"][0]["inference_count"]
    handle, key = region(regions, "in", INT32_BYTES)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    triton.register_system_shared_memory("in", key, INT32_BYTES)
    for _ in range(3):
        triton.infer("simple", _simple_inputs(httpclient, "in", INT32_BYTES))
    stats = triton.get_inference_statistics("simple")["model_stats"][0]
    assert stats["inference_count"] == before + 3
    assert stats["inference_stats"]["success"]["count"] >= 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_perf_analyzer_with_system_shared_memory(shm_server: ServerProcess, protocol: str) -> None:
    if not PERF_ANALYZER.exists():
        pytest.skip("perf_analyzer is not installed")
    port = shm_server.http_port if protocol == "http" else shm_server.grpc_port
    run_perf_analyzer("simple", protocol, f"127.0.0.1:{port}", "--shared-memory", "system",
                      "--output-shared-memory-size", "256", "-b", "2")  # fmt: skip
    triton = client(shm_server, "http")
    assert triton.get_system_shared_memory_status() == []  # perf_analyzer cleaned up
