"""JSON bodies of the non-inference HTTP routes, in the shapes Triton's clients parse."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from batchserve.core.types import ModelMetadata, ServerMetadata, TensorMetadata
from batchserve.dataplane.control import IndexEntry
from batchserve.dataplane.statistics import (
    RESPONSE_KINDS,
    InferBatchStatistics,
    InferResponseStatistics,
    InstanceMemory,
    MemoryUsage,
    ModelStatistics,
    Setting,
    StatisticDuration,
    Tuning,
)

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _is_map(field: Any) -> bool:
    message_type = field.message_type
    return message_type is not None and bool(message_type.GetOptions().map_entry)


def _int64_as_numbers(message: Message, data: dict[str, Any]) -> None:
    """Protobuf's JSON writes 64-bit integers as strings; Triton's clients expect numbers."""
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif _is_map(field):  # of messages (response_stats): each value converted alike
            entry = field.message_type
            if entry is not None and entry.fields_by_name["value"].message_type is not None:
                for key, child in getattr(message, field.name).items():
                    _int64_as_numbers(child, value[str(key)])
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            children = getattr(message, field.name)
            pairs = (
                zip(children, value, strict=True)
                if isinstance(value, list)
                else [(children, value)]
            )
            for child, child_data in pairs:
                _int64_as_numbers(child, child_data)


def message_json(message: Message) -> dict[str, Any]:
    """A protobuf message as Triton renders it: proto field names, numbers, defaults shown."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(message, data)
    return data


def server_metadata(meta: ServerMetadata) -> dict[str, Any]:
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def _tensor(meta: TensorMetadata) -> dict[str, Any]:
    return {"name": meta.name, "datatype": meta.datatype, "shape": list(meta.shape)}


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [_tensor(t) for t in meta.inputs],
        "outputs": [_tensor(t) for t in meta.outputs],
    }


def _duration(d: StatisticDuration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def _response(r: InferResponseStatistics) -> dict[str, dict[str, int]]:
    return {kind: _duration(getattr(r, kind)) for kind in RESPONSE_KINDS}


def _batch(b: InferBatchStatistics) -> dict[str, Any]:
    return {
        "batch_size": b.batch_size,
        "compute_input": _duration(b.compute_input),
        "compute_infer": _duration(b.compute_infer),
        "compute_output": _duration(b.compute_output),
    }


def _memory_usage(m: MemoryUsage) -> dict[str, Any]:
    return {"type": m.type, "id": m.id, "byte_size": m.byte_size}


def _instance(m: InstanceMemory) -> dict[str, Any]:
    return {
        "device": m.device,
        "fixed_bytes": m.fixed_bytes,
        "per_sample_bytes": m.per_sample_bytes,
        "reserved_bytes": m.reserved_bytes,
        "batch_cap": m.batch_cap,
        "batch_steps": m.batch_steps,
    }


def _model_stats(row: ModelStatistics) -> dict[str, Any]:
    s = row.inference_stats
    return {
        "name": row.name,
        "version": row.version,
        "last_inference": row.last_inference,
        "inference_count": row.inference_count,
        "execution_count": row.execution_count,
        "inference_stats": {
            "success": _duration(s.success),
            "fail": _duration(s.fail),
            "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input),
            "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output),
            "cache_hit": _duration(s.cache_hit),
            "cache_miss": _duration(s.cache_miss),
        },
        "response_stats": {key: _response(r) for key, r in row.response_stats},
        "batch_stats": [_batch(b) for b in row.batch_stats],
        "memory_usage": [_memory_usage(m) for m in row.memory_usage],
        "batchserve": {
            "batch_cap": row.batch_cap,
            "instances": [_instance(m) for m in row.instances],
            **_measured_defaults(row.measured_defaults),
            "cpu_below_batch_size": row.cpu_below_batch_size,
            "batch_steps": row.batch_steps,
            "cpu_below_positions": row.cpu_below_positions,
        },
    }


def _setting(setting: Setting, samples_per_second: float = 0.0, error: str = "") -> dict[str, Any]:
    return {
        "instances": setting.instances,
        "threads": setting.threads,
        "cuda_graphs": setting.cuda_graphs,
        "cpu_instances": setting.cpu_instances,
        "samples_per_second": samples_per_second,
        "error": error,
    }


def _measured_defaults(tuning: Tuning | None) -> dict[str, Any]:
    """The ``measured_defaults`` entry (absent, as in protobuf's JSON, when none was made)."""
    if tuning is None:
        return {}
    measured = [_setting(t.setting, t.samples_per_s, t.error) for t in tuning.trials]
    return {
        "measured_defaults": {
            "chosen": _setting(tuning.chosen),
            "reason": tuning.reason,
            "seconds": tuning.seconds,
            "measured": measured,
        }
    }


def statistics(rows: list[ModelStatistics]) -> dict[str, Any]:
    return {"model_stats": [_model_stats(r) for r in rows]}


def repository_index(rows: list[IndexEntry]) -> list[dict[str, str]]:
    """Triton's rows: no version for a model not loaded by version, no reason when none."""
    return [_index_row(r) for r in rows]


def _index_row(row: IndexEntry) -> dict[str, str]:
    fields = {"name": row.name, "version": row.version, "state": row.state, "reason": row.reason}
    return {key: value for key, value in fields.items() if value or key == "name"}
