"""Protobuf messages of the non-inference gRPC calls, built from the dataplane's answers."""

from __future__ import annotations

from batchserve.core.types import ModelMetadata, ServerMetadata, TensorMetadata
from batchserve.dataplane.plane import VersionStats
from batchserve.dataplane.shared_memory.manager import RegionStatus
from batchserve.models.model_table import IndexEntry
from batchserve.observability.stats import BatchStats, Duration
from batchserve.proto import grpc_service_pb2 as pb


def server_metadata(meta: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=list(meta.extensions)
    )


def _tensor(meta: TensorMetadata) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=meta.name, datatype=meta.datatype, shape=list(meta.shape)
    )


def model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=list(meta.versions),
        platform=meta.platform,
        inputs=[_tensor(t) for t in meta.inputs],
        outputs=[_tensor(t) for t in meta.outputs],
    )


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def _batch(size: int, b: BatchStats) -> pb.InferBatchStatistics:
    return pb.InferBatchStatistics(
        batch_size=size,
        compute_input=_duration(b.compute_input),
        compute_infer=_duration(b.compute_infer),
        compute_output=_duration(b.compute_output),
    )


def _batchserve(row: VersionStats) -> pb.BatchserveStatistics:
    return pb.BatchserveStatistics(
        batch_cap=row.batch_cap,
        instances=[
            pb.BatchserveStatistics.InstanceMemory(
                device=str(m.device), fixed_bytes=m.profile.fixed_bytes,
                per_sample_bytes=m.profile.per_sample_bytes,
                reserved_bytes=m.reserved_bytes, batch_cap=m.batch_cap,
            )
            for m in row.memory
        ],
    )  # fmt: skip


def _model_stats(row: VersionStats) -> pb.ModelStatistics:
    s = row.stats
    return pb.ModelStatistics(
        name=row.name,
        version=row.version,
        last_inference=s.last_inference_ms,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success),
            fail=_duration(s.fail),
            queue=_duration(s.queue),
            compute_input=_duration(s.compute_input),
            compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output),
        ),
        batch_stats=[_batch(size, b) for size, b in sorted(s.batches.items())],
        memory_usage=[
            pb.MemoryUsage(
                type=m.device.kind.upper(), id=m.device.index, byte_size=m.reserved_bytes
            )
            for m in row.memory
        ],
        batchserve=_batchserve(row),
    )


def statistics(rows: list[VersionStats]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[_model_stats(r) for r in rows])


def repository_index(rows: list[IndexEntry]) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=r.name, version=r.version, state=r.state, reason=r.reason
            )
            for r in rows
        ]
    )


def system_shared_memory_status(
    rows: list[RegionStatus],
) -> pb.SystemSharedMemoryStatusResponse:
    row = pb.SystemSharedMemoryStatusResponse.RegionStatus
    regions = {
        r.name: row(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size) for r in rows
    }
    return pb.SystemSharedMemoryStatusResponse(regions=regions)


def cuda_shared_memory_status(rows: list[RegionStatus]) -> pb.CudaSharedMemoryStatusResponse:
    row = pb.CudaSharedMemoryStatusResponse.RegionStatus
    regions = {r.name: row(name=r.name, device_id=r.device_id, byte_size=r.byte_size) for r in rows}
    return pb.CudaSharedMemoryStatusResponse(regions=regions)
