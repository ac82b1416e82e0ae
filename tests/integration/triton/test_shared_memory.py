"""The system and CUDA shared-memory examples of NVIDIA's Python client, over HTTP and gRPC.

Regions are created with ``tritonclient.utils.shared_memory`` exactly as the examples do;
their keys carry this process's id so that parallel runs on one machine do not collide.
The CUDA examples need a GPU and skip, saying why, where cuda_shared_memory cannot run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils

from tests.integration.server import ServerProcess
from tests.integration.triton.checks import INPUT0, ONES, TIMEOUT, grpc_client, http_client, strings

Client = Any  # tritonclient.http or tritonclient.grpc InferenceServerClient


def _key(name: str) -> str:
    return f"/{name}_{os.getpid()}"


def _client(server: ServerProcess, protocol: str) -> Client:
    return http_client(server.http_url) if protocol == "http" else grpc_client(server.grpc_url)


def _module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _kwargs(protocol: str) -> dict[str, float]:
    return {} if protocol == "http" else {"client_timeout": TIMEOUT}


def _meta(output: Any) -> tuple[str, list[int]]:
    """An output's datatype and shape: a dict from HTTP, a message from gRPC."""
    assert output is not None, "the response has no such output"
    if isinstance(output, dict):
        return output["datatype"], output["shape"]
    return output.datatype, list(output.shape)


def _destroy(handles: list[Any]) -> None:
    """Destroy each region once, where the example destroys them."""
    while handles:
        shm.destroy_shared_memory_region(handles.pop())


@pytest.fixture
def regions() -> Iterator[list[Any]]:
    """Handles made by one test; destroyed even when the test fails before it does."""
    handles: list[Any] = []
    yield handles
    _destroy(handles)


def _simple_shm(server: ServerProcess, protocol: str, regions: list[Any]) -> None:
    """simple_{http,grpc}_shm_client.py: one input region for both inputs, one for both outputs."""
    client, module, kw = _client(server, protocol), _module(protocol), _kwargs(protocol)
    client.unregister_system_shared_memory(**kw)
    client.unregister_cuda_shared_memory(**kw)
    input0, input1 = INPUT0[0], ONES[0]
    size = input0.size * input0.itemsize
    out_key, in_key = _key("output_simple"), _key("input_simple")
    out_handle = shm.create_shared_memory_region("output_data", out_key, size * 2)
    regions.append(out_handle)
    client.register_system_shared_memory("output_data", out_key, size * 2, **kw)
    in_handle = shm.create_shared_memory_region("input_data", in_key, size * 2)
    regions.append(in_handle)
    shm.set_shared_memory_region(in_handle, [input0])
    shm.set_shared_memory_region(in_handle, [input1], offset=size)
    client.register_system_shared_memory("input_data", in_key, size * 2, **kw)

    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
    inputs[0].set_shared_memory("input_data", size)
    inputs[1].set_shared_memory("input_data", size, offset=size)
    outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
    outputs[0].set_shared_memory("output_data", size)
    outputs[1].set_shared_memory("output_data", size, offset=size)
    results = client.infer(model_name="simple", inputs=inputs, outputs=outputs, **kw)

    datatype, shape = _meta(results.get_output("OUTPUT0"))
    output0 = shm.get_contents_as_numpy(out_handle, utils.triton_to_np_dtype(datatype), shape)
    datatype, shape = _meta(results.get_output("OUTPUT1"))
    output1 = shm.get_contents_as_numpy(
        out_handle, utils.triton_to_np_dtype(datatype), shape, offset=size
    )
    for i in range(16):
        assert input0[i] + input1[i] == output0[0][i], f"incorrect sum: {output0}"
        assert input0[i] - input1[i] == output1[0][i], f"incorrect difference: {output1}"
    client.unregister_system_shared_memory(**kw)
    assert len(shm.mapped_shared_memory_regions()) == 2
    _destroy(regions)
    assert len(shm.mapped_shared_memory_regions()) == 0


def test_simple_http_shm_client(triton_server: ServerProcess, regions: list[Any]) -> None:
    _simple_shm(triton_server, "http", regions)


def test_simple_grpc_shm_client(triton_server: ServerProcess, regions: list[Any]) -> None:
    _simple_shm(triton_server, "grpc", regions)


def _string_shm(server: ServerProcess, protocol: str, regions: list[Any]) -> None:
    """simple_{http,grpc}_shm_string_client.py: serialized BYTES tensors, one region each."""
    client, module, kw = _client(server, protocol), _module(protocol), _kwargs(protocol)
    client.unregister_system_shared_memory(**kw)
    client.unregister_cuda_shared_memory(**kw)
    in0, in1 = INPUT0[0], ONES[0]
    expected_sum, expected_diff = strings(in0 + in1), strings(in0 - in1)
    serialized = [
        utils.serialize_byte_tensor(x)
        for x in (strings(in0), strings(in1), expected_sum, expected_diff)
    ]
    in0_size, in1_size, out0_size, out1_size = (utils.serialized_byte_size(x) for x in serialized)

    handles = {}
    for name, size in (
        ("output0", out0_size),
        ("output1", out1_size),
        ("input0", in0_size),
        ("input1", in1_size),
    ):
        key = _key(f"{name}_simple")
        handles[name] = shm.create_shared_memory_region(f"{name}_data", key, size)
        regions.append(handles[name])
        if name.startswith("input"):
            shm.set_shared_memory_region(handles[name], [serialized[int(name[-1])]])
        client.register_system_shared_memory(f"{name}_data", key, size, **kw)

    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    inputs[0].set_shared_memory("input0_data", in0_size)
    inputs[1].set_shared_memory("input1_data", in1_size)
    outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
    outputs[0].set_shared_memory("output0_data", out0_size)
    outputs[1].set_shared_memory("output1_data", out1_size)
    results = client.infer(model_name="simple_string", inputs=inputs, outputs=outputs, **kw)

    datatype, shape = _meta(results.get_output("OUTPUT0"))
    output0 = shm.get_contents_as_numpy(
        handles["output0"], utils.triton_to_np_dtype(datatype), shape
    )
    datatype, shape = _meta(results.get_output("OUTPUT1"))
    output1 = shm.get_contents_as_numpy(
        handles["output1"], utils.triton_to_np_dtype(datatype), shape
    )
    for i in range(16):
        assert expected_sum[i] == output0[0][i], f"incorrect sum: {output0}"
        assert expected_diff[i] == output1[0][i], f"incorrect difference: {output1}"
    client.unregister_system_shared_memory(**kw)
    assert len(shm.mapped_shared_memory_regions()) == 4
    _destroy(regions)
    assert len(shm.mapped_shared_memory_regions()) == 0


def test_simple_http_shm_string_client(triton_server: ServerProcess, regions: list[Any]) -> None:
    _string_shm(triton_server, "http", regions)


def test_simple_grpc_shm_string_client(triton_server: ServerProcess, regions: list[Any]) -> None:
    _string_shm(triton_server, "grpc", regions)


def _reuse(server: ServerProcess, protocol: str, regions: list[Any]) -> None:
    """reuse_infer_objects_client.py: the same InferInput/Output objects, shm -> data -> shm."""
    client, module, kw = _client(server, protocol), _module(protocol), _kwargs(protocol)
    client.unregister_system_shared_memory(**kw)
    client.unregister_cuda_shared_memory(**kw)
    input0, input1 = INPUT0[0], ONES[0]
    size = input0.size * input0.itemsize
    handles = {}
    for name, data in (
        ("output0", None),
        ("output1", None),
        ("input0", input0),
        ("input1", input1),
    ):
        key = _key(f"{name}_simple")
        handles[name] = shm.create_shared_memory_region(f"{name}_data", key, size)
        regions.append(handles[name])
        if data is not None:
            shm.set_shared_memory_region(handles[name], [data])
        client.register_system_shared_memory(f"{name}_data", key, size, **kw)
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
    outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]

    def infer_and_validate(use_shared_memory: bool) -> None:
        in1 = input1 if use_shared_memory else input1 * 2
        if use_shared_memory:
            inputs[0].set_shared_memory("input0_data", size)
            inputs[1].set_shared_memory("input1_data", size)
            outputs[0].set_shared_memory("output0_data", size)
            outputs[1].set_shared_memory("output1_data", size)
        else:
            inputs[0].set_data_from_numpy(np.expand_dims(input0, axis=0))
            inputs[1].set_data_from_numpy(np.expand_dims(in1, axis=0))
            outputs[0].unset_shared_memory()
            outputs[1].unset_shared_memory()
        results = client.infer(model_name="simple", inputs=inputs, outputs=outputs, **kw)
        answers = []
        for index in (0, 1):
            name = f"OUTPUT{index}"
            datatype, shape = _meta(results.get_output(name))
            if use_shared_memory:
                dtype = utils.triton_to_np_dtype(datatype)
                answers.append(shm.get_contents_as_numpy(handles[f"output{index}"], dtype, shape))
            else:
                answers.append(results.as_numpy(name))
        for i in range(16):
            assert input0[i] + in1[i] == answers[0][0][i], f"incorrect sum: {answers[0]}"
            assert input0[i] - in1[i] == answers[1][0][i], f"incorrect difference: {answers[1]}"

    infer_and_validate(True)
    infer_and_validate(False)
    infer_and_validate(True)
    client.unregister_system_shared_memory(**kw)


def test_reuse_infer_objects_client_http(triton_server: ServerProcess, regions: list[Any]) -> None:
    _reuse(triton_server, "http", regions)


def test_reuse_infer_objects_client_grpc(triton_server: ServerProcess, regions: list[Any]) -> None:
    _reuse(triton_server, "grpc", regions)


def _cudashm() -> Any:
    """cuda_shared_memory, or a skip saying why it cannot run on this machine."""
    import tritonclient.utils.cuda_shared_memory as cudashm

    try:
        probe = cudashm.create_shared_memory_region("probe", 64, 0)
    except Exception as error:  # no GPU, no driver, no CUDA runtime: all mean the same here
        pytest.skip(
            f"needs an NVIDIA GPU: tritonclient.utils.cuda_shared_memory cannot run ({error})"
        )
    cudashm.destroy_shared_memory_region(probe)
    return cudashm


def _cuda_shm(server: ServerProcess, protocol: str) -> None:
    """simple_{http,grpc}_cudashm_client.py: four GPU regions on device 0, registered by handle."""
    cudashm = _cudashm()
    client, module, kw = _client(server, protocol), _module(protocol), _kwargs(protocol)
    client.unregister_system_shared_memory(**kw)
    client.unregister_cuda_shared_memory(**kw)
    input0, input1 = INPUT0[0], ONES[0]
    size = input0.size * input0.itemsize
    handles = {}
    try:
        for name, data in (
            ("output0", None),
            ("output1", None),
            ("input0", input0),
            ("input1", input1),
        ):
            handles[name] = cudashm.create_shared_memory_region(f"{name}_data", size, 0)
            if data is not None:
                cudashm.set_shared_memory_region(handles[name], [data])
            raw = cudashm.get_raw_handle(handles[name])
            client.register_cuda_shared_memory(f"{name}_data", raw, 0, size, **kw)
        inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
        outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]
        for index in (0, 1):
            inputs[index].set_shared_memory(f"input{index}_data", size)
            outputs[index].set_shared_memory(f"output{index}_data", size)
        results = client.infer(model_name="simple", inputs=inputs, outputs=outputs, **kw)
        answers = []
        for index in (0, 1):
            datatype, shape = _meta(results.get_output(f"OUTPUT{index}"))
            dtype = utils.triton_to_np_dtype(datatype)
            answers.append(cudashm.get_contents_as_numpy(handles[f"output{index}"], dtype, shape))
        for i in range(16):
            assert input0[i] + input1[i] == answers[0][0][i], f"incorrect sum: {answers[0]}"
            assert input0[i] - input1[i] == answers[1][0][i], f"incorrect difference: {answers[1]}"
        client.unregister_cuda_shared_memory(**kw)
        assert len(cudashm.allocated_shared_memory_regions()) == 4
    finally:
        for handle in handles.values():
            cudashm.destroy_shared_memory_region(handle)
    assert len(cudashm.allocated_shared_memory_regions()) == 0


@pytest.mark.gpu
def test_simple_http_cudashm_client(triton_server: ServerProcess) -> None:
    _cuda_shm(triton_server, "http")


@pytest.mark.gpu
def test_simple_grpc_cudashm_client(triton_server: ServerProcess) -> None:
    _cuda_shm(triton_server, "grpc")
