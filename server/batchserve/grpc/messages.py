"""Protobuf messages of the non-inference gRPC calls, built from the dataplane's answers."""

from __future__ import annotations

from batchserve.core.types import ModelMetadata, ServerMetadata, TensorMetadata
from batchserve.dataplane.control import IndexEntry
from batchserve.dataplane.shared_memory.manager import RegionStatus
from batchserve.dataplane.statistics import (
    RESPONSE_KINDS,
    InferBatchStatistics,
    InferResponseStatistics,
    InstanceMemory,
    ModelStatistics,
    Setting,
    StatisticDuration,
    Tuning,
)
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


def _duration(d: StatisticDuration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def _response(r: InferResponseStatistics) -> pb.InferResponseStatistics:
    return pb.InferResponseStatistics(
        **{kind: _duration(getattr(r, kind)) for kind in RESPONSE_KINDS}
    )


def _batch(b: InferBatchStatistics) -> pb.InferBatchStatistics:
    return pb.InferBatchStatistics(
        batch_size=b.batch_size,
        compute_input=_duration(b.compute_input),
        compute_infer=_duration(b.compute_infer),
        compute_output=_duration(b.compute_output),
    )


def _instance(m: InstanceMemory) -> pb.BatchserveStatistics.InstanceMemory:
    return pb.BatchserveStatistics.InstanceMemory(
        device=m.device, fixed_bytes=m.fixed_bytes, per_sample_bytes=m.per_sample_bytes,
        reserved_bytes=m.reserved_bytes, batch_cap=m.batch_cap, batch_steps=m.batch_steps,
    )  # fmt: skip


def _model_stats(row: ModelStatistics) -> pb.ModelStatistics:
    s = row.inference_stats
    return pb.ModelStatistics(
        name=row.name,
        version=row.version,
        last_inference=row.last_inference,
        inference_count=row.inference_count,
        execution_count=row.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success),
            fail=_duration(s.fail),
            queue=_duration(s.queue),
            compute_input=_duration(s.compute_input),
            compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output),
            cache_hit=_duration(s.cache_hit),
            cache_miss=_duration(s.cache_miss),
        ),
        response_stats={key: _response(r) for key, r in row.response_stats},
        batch_stats=[_batch(b) for b in row.batch_stats],
        memory_usage=[
            pb.MemoryUsage(type=m.type, id=m.id, byte_size=m.byte_size) for m in row.memory_usage
        ],
        batchserve=pb.BatchserveStatistics(
            batch_cap=row.batch_cap,
            instances=[_instance(m) for m in row.instances],
            measured_defaults=_measured_defaults(row.measured_defaults),
            cpu_below_batch_size=row.cpu_below_batch_size,
            batch_steps=row.batch_steps,
            cpu_below_positions=row.cpu_below_positions,
        ),
    )


def _setting(
    setting: Setting, samples_per_second: float = 0.0, error: str = ""
) -> pb.BatchserveStatistics.MeasuredSetting:
    return pb.BatchserveStatistics.MeasuredSetting(
        instances=setting.instances, threads=setting.threads, cuda_graphs=setting.cuda_graphs,
        cpu_instances=setting.cpu_instances,
        samples_per_second=samples_per_second, error=error,
    )  # fmt: skip


def _measured_defaults(tuning: Tuning | None) -> pb.BatchserveStatistics.MeasuredDefaults | None:
    if tuning is None:
        return None
    return pb.BatchserveStatistics.MeasuredDefaults(
        chosen=_setting(tuning.chosen), reason=tuning.reason, seconds=tuning.seconds,
        measured=[_setting(t.setting, t.samples_per_s, t.error) for t in tuning.trials],
    )  # fmt: skip


def statistics(rows: list[ModelStatistics]) -> pb.ModelStatisticsResponse:
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
