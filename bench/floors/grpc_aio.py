"""The grpc.aio echo floor on uvloop, with tritonclient's generated service stubs.

    python -m bench.floors.grpc_aio [--port 0]

It must not import batchserve: both define protobuf files named model_config.proto.
"""

# The servicer's method names are fixed by the service definition.
# ruff: noqa: N802

from __future__ import annotations

import argparse
from typing import Any

import grpc
import uvloop
from tritonclient.grpc import model_config_pb2 as mc  # type: ignore[import-untyped]
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from bench.floors.echo import MODEL, WIDTH

OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]
_TENSOR = pb.ModelMetadataResponse.TensorMetadata
METADATA = pb.ModelMetadataResponse(
    name=MODEL, versions=["1"], platform="echo",
    inputs=[_TENSOR(name="INPUT__0", datatype="FP32", shape=[-1, WIDTH])],
    outputs=[_TENSOR(name="OUTPUT__0", datatype="FP32", shape=[-1, WIDTH])],
)  # fmt: skip
CONFIG = pb.ModelConfigResponse(config=mc.ModelConfig(
    name=MODEL, backend="echo", max_batch_size=64,
    input=[mc.ModelInput(name="INPUT__0", data_type=mc.TYPE_FP32, dims=[WIDTH])],
    output=[mc.ModelOutput(name="OUTPUT__0", data_type=mc.TYPE_FP32, dims=[WIDTH])],
))  # fmt: skip


class EchoServicer(pbg.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Just the calls perf_analyzer makes; each infer answers with its own input."""

    def __init__(self) -> None:
        self.count = 0

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="echo", version="0")

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return METADATA

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return CONFIG

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = pb.ModelStatistics(
            name=MODEL, version="1", inference_count=self.count, execution_count=self.count
        )
        return pb.ModelStatisticsResponse(model_stats=[stats])

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.count += 1
        answer = pb.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
        answer.outputs.add(name="OUTPUT__0", datatype="FP32", shape=request.inputs[0].shape)
        answer.raw_output_contents.append(request.raw_input_contents[0])
        return answer


async def serve(port: int) -> None:
    server = grpc.aio.server(options=OPTIONS)
    pbg.add_GRPCInferenceServiceServicer_to_server(EchoServicer(), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"READY {bound}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description="grpc.aio v2 echo server on uvloop")
    parser.add_argument("--port", type=int, default=0)
    uvloop.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
