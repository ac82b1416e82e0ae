"""``model_metrics`` as Triton reads it: the parts a control must have, checked with the
rest of the config in Triton's words (its ``L0_model_config`` model_metrics cases), and the
families that take no buckets, warned of at load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from batchserve.core.budgets import parse_budgets
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.model_config import parse_pbtxt
from batchserve.models.model_directory import InvalidModel
from batchserve.models.model_metrics import uncustomizable_family_warnings
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.scheduler.memory import MemoryBudgets
from onnx_models import write_model

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
BUCKETS = (
    f'metric_identifier {{ family: "{FIRST_RESPONSE}" }} histogram_options {{ buckets: [1, 2] }}'
)


def _control(body: str) -> str:
    return f"model_metrics {{ metric_control [ {{ {body} }} ] }}"


def _repository(root: Path, config: str) -> Path:
    write_model(root / "digits" / "1" / "model.onnx")
    (root / "digits" / "config.pbtxt").write_text(config)
    return root


@pytest.mark.parametrize(
    ("control", "triton"),
    [
        (
            "histogram_options { buckets: [1] }",
            "metric control must specify 'metric_identifier'",
        ),
        (
            "metric_identifier { } histogram_options { buckets: [1] }",
            "metric identifier must specify non-empty 'family'",
        ),
        (
            f'metric_identifier {{ family: "{FIRST_RESPONSE}" }}',
            "metric control must specify 'histogram_options'",
        ),
        (
            f'metric_identifier {{ family: "{FIRST_RESPONSE}" }} histogram_options {{ }}',
            "histogram options must specify non-empty 'buckets'",
        ),
    ],
)
def test_a_control_missing_a_part_fails_the_model_in_tritons_words(
    tmp_path: Path, control: str, triton: str
) -> None:
    root = _repository(tmp_path, _control(control))
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(root).resolve("digits")
    assert caught.value.problems == (
        f"digits/config.pbtxt: {triton} (batchserve: model_metrics.metric_control[0])",
    )


def test_a_complete_control_resolves(tmp_path: Path) -> None:
    root = _repository(tmp_path, _control(BUCKETS))
    resolved = ModelRepository(root).resolve("digits").config
    assert list(resolved.model_metrics.metric_control[0].histogram_options.buckets) == [1, 2]


def test_only_the_first_response_histogram_takes_buckets() -> None:
    config = parse_pbtxt(
        'name: "m" model_metrics { metric_control [ '
        f"{{ {BUCKETS} }}, "
        '{ metric_identifier { family: "nv_inference_request_success" } '
        "histogram_options { buckets: [1] } } ] }"
    )
    (warning,) = uncustomizable_family_warnings(config)
    assert warning.startswith(
        "Metric family 'nv_inference_request_success' in 'metric_identifier' is not a "
        "customizable metric in Triton core."
    )


@pytest.mark.anyio
async def test_the_load_warns_of_a_family_that_takes_no_buckets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    control = (
        'metric_identifier { family: "nv_inference_request_success" } '
        "histogram_options { buckets: [1] }"
    )
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    repository = ModelRepository(_repository(tmp_path, _control(control)))
    registry = ModelRegistry(repository, 8, budgets)
    with caplog.at_level(logging.WARNING):
        await registry.load("digits")
    await registry.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'nv_inference_request_success'" in line for line in warned), warned
