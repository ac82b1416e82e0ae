"""A config's ``model_metrics`` block, read as Triton reads it: what each ``metric_control``
must hold (checked when the config is, in Triton's words), and the families it names that
take no buckets (a warning at load, as Triton's metric reporter gives it; the control is
then ignored)."""

from __future__ import annotations

from batchserve.observability.latency_summaries import FIRST_RESPONSE_FAMILY
from batchserve.proto.model_config_pb2 import ModelConfig

CUSTOMIZABLE_FAMILIES = (FIRST_RESPONSE_FAMILY,)
"""The families whose histogram buckets a config may set (Triton core's, likewise)."""


def model_metrics_problems(config: ModelConfig) -> list[str]:
    """Each control missing a part, in Triton's ValidateModelMetrics words (which stops at
    the first; batchserve lists them all, each with its position)."""
    problems = []
    for position, control in enumerate(config.model_metrics.metric_control):
        where = f"(batchserve: model_metrics.metric_control[{position}])"
        if not control.HasField("metric_identifier"):
            problems.append(f"metric control must specify 'metric_identifier' {where}")
        elif not control.metric_identifier.family:
            problems.append(f"metric identifier must specify non-empty 'family' {where}")
        elif not control.HasField("histogram_options"):
            problems.append(f"metric control must specify 'histogram_options' {where}")
        elif not control.histogram_options.buckets:
            problems.append(f"histogram options must specify non-empty 'buckets' {where}")
    return problems


def uncustomizable_family_warnings(config: ModelConfig) -> list[str]:
    """A warning for each control naming a family that takes no buckets."""
    return [
        f"Metric family '{family}' in 'metric_identifier' is not a customizable metric in "
        f"Triton core. (batchserve: model '{config.name}': only "
        f"{', '.join(CUSTOMIZABLE_FAMILIES)} takes buckets; this control is ignored)"
        for control in config.model_metrics.metric_control
        if (family := control.metric_identifier.family) not in CUSTOMIZABLE_FAMILIES
    ]
