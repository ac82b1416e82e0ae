"""The GPU check's pure helpers: what it installs, its environment, its test summary, its load
generator's arithmetic, the served variants' configs and the accuracy figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInstanceGroup

from bench.gpu import accuracy, load, networks, requirements, tests, variants, venv
from bench.gpu.records import Key, Variant

KEY = Key("resnet50ish", "ort-cuda", "fp16")


def test_requirements_are_the_project_s_the_client_s_and_the_check_s() -> None:
    wanted = requirements.runtime()
    names = [text.split("<")[0].split(">")[0].split("[")[0] for text in wanted]
    assert len(names) == len(set(names)), "one line per distribution"
    assert any(text.startswith("fastapi") for text in wanted)
    assert any(text.startswith("uvicorn[standard]") for text in wanted)
    assert any(text.startswith("pytest") for text in wanted)
    assert not any(text.startswith(("torch", "onnxruntime", "tensorrt")) for text in wanted)
    assert any(text.startswith("setuptools") for text in requirements.build())


def test_repeated_requirements_merge_their_specifiers() -> None:
    merged = requirements._unique(["numpy>=1.24", "grpcio>=1.62", "numpy>=1.26"])
    assert merged == ["numpy>=1.24,>=1.26", "grpcio>=1.62"]


def test_unmet_names_what_is_missing_or_too_old() -> None:
    installed = {"numpy": "2.5.2", "grpcio": "1.78.0", "pydantic-settings": "2.4.0"}
    wanted = ["numpy>=1.26", "grpcio>=1.84", "fastapi>=0.115", "pydantic_settings>=2.4",
              "uvloop; sys_platform == 'win32'"]  # fmt: skip
    assert requirements.unmet(wanted, installed) == [
        ("grpcio>=1.84", "1.78.0 installed"),
        ("fastapi>=0.115", "not installed"),
    ]


def test_only_the_client_wheels_a_machine_lacks_are_installed() -> None:
    """By distribution, whatever version the machine has: nothing it has is replaced."""
    wheels = [Path(f"clients/{name}") for name in (
        "tritonclient-2.73.0-py3-none-any.whl",
        "python_rapidjson-1.25-cp312-cp312-manylinux_2_28_x86_64.whl",
        "zope_interface-8.7-cp312-cp312-manylinux1_x86_64.whl",
        "aiohttp-3.14.5-cp312-cp312-manylinux2014_x86_64.whl",
    )]  # fmt: skip
    installed = {"aiohttp": "3.9.0", "zope-interface": "6.0", "numpy": "2.5.2"}
    assert [w.name.split("-")[0] for w in requirements.missing_wheels(wheels, installed)] == [
        "python_rapidjson",
        "tritonclient",
    ]
    assert any(text.startswith("tritonclient[http,grpc]") for text in requirements.CLIENTS)


def test_a_nested_environment_sees_its_parent_s_packages_only_when_it_has_one() -> None:
    assert venv.parent_site_dirs("/usr", "/usr", ["/usr/lib/site"]) == []
    assert venv.parent_site_dirs("/env", "/usr", ["/env/lib/site"]) == ["/env/lib/site"]
    lines = venv.pth_lines(["/env/lib/site", "/env/lib64/site"])
    assert lines == (
        "import site; site.addsitedir('/env/lib/site')\n"
        "import site; site.addsitedir('/env/lib64/site')\n"
    )


@pytest.mark.slow
def test_an_environment_made_from_a_virtualenv_imports_the_parent_s_packages(
    tmp_path: Path,
) -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests are not running in a virtual environment")
    target = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "bench.gpu.venv", str(target)], check=True,
                   cwd=Path(__file__).resolve().parents[2], timeout=300)  # fmt: skip
    code = "import batchserve, sys; print(sys.prefix)"  # an editable install of the parent
    done = subprocess.run([target / "bin" / "python", "-c", code], capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == str(target)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_gpu" name="test_ok" time="0.1"/>
<testcase classname="tests.unit.test_gpu" name="test_skip_a" time="0"><skipped type="pytest.skip"
 message="needs an NVIDIA GPU">x</skipped></testcase>
<testcase classname="tests.unit.test_gpu" name="test_skip_b" time="0"><skipped
 message="needs an NVIDIA GPU"/></testcase>
<testcase classname="tests.unit.test_trt" name="test_bad" time="1"><failure
 message="AssertionError: engine differs&#10;second line">trace</failure></testcase>
<testcase classname="tests.unit.test_trt" name="test_broken" time="1"><error
 message="fixture failed">trace</error></testcase>
<testcase classname="" name="tests.unit.test_onnx" time="0"><error message="collection failure"
>tests/unit/test_onnx.py:3: in &lt;module&gt;
    import onnxruntime
E   ModuleNotFoundError: No module named 'onnxruntime'</error></testcase>
</testsuite></testsuites>"""


def test_junit_is_summarised_with_failures_and_skip_reasons() -> None:
    found = tests.parse_junit("tests/unit", JUNIT, 12.5)
    assert (found.passed, found.failed, found.errors, found.skipped) == (1, 1, 2, 2)
    assert found.failures == (
        ("tests.unit.test_trt::test_bad", "AssertionError: engine differs"),
        ("tests.unit.test_trt::test_broken", "fixture failed"),
        (
            "tests.unit.test_onnx",
            "collection failure: ModuleNotFoundError: No module named 'onnxruntime'",
        ),
    )
    assert found.skips == (("needs an NVIDIA GPU", 2),)


def test_marked_files_are_grouped_by_test_directory(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    for name, text in [("unit/test_a.py", "@pytest.mark.gpu"), ("unit/test_b.py", "nothing"),
                       ("gpu/test_c.py", "pytestmark = pytest.mark.gpu")]:  # fmt: skip
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert tests.groups(tests.marked_files(root), root) == {
        "tests/gpu": ["tests/gpu/test_c.py"],
        "tests/unit": ["tests/unit/test_a.py"],
    }


def test_load_is_spread_evenly_over_the_client_processes() -> None:
    assert load.shares(1, 4) == [1]
    assert load.shares(16, 4) == [4, 4, 4, 4]
    assert load.shares(10, 4) == [3, 3, 2, 2]
    assert load.shares(4, 1) == [4]


def test_a_point_is_the_answers_in_the_window() -> None:
    parts = [
        {"latencies": [0.001] * 98 + [0.010, 0.020], "errors": 0, "error": ""},
        {"latencies": [0.001] * 100, "errors": 0, "error": ""},
    ]
    found = load.summarise(parts, 2.0)
    assert found["throughput"] == 100.0
    assert found["p50_us"] == pytest.approx(1000.0)
    assert 1000.0 < found["p99_us"] <= 10_000.0


def test_any_failed_request_fails_the_point() -> None:
    parts = [{"latencies": [0.001], "errors": 0, "error": ""},
             {"latencies": [], "errors": 3, "error": "RuntimeError: HTTP 503"}]  # fmt: skip
    assert load.summarise(parts, 1.0) == {
        "error": "3 requests failed; the first: RuntimeError: HTTP 503"
    }
    assert "no answer arrived" in load.summarise([{"latencies": [], "errors": 0}], 1.0)["error"]


def test_http_answers_are_read_by_their_content_length() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 42\r\n\r\n"
    assert load._status_and_length(head) == (200, 42)
    with pytest.raises(RuntimeError, match="without Content-Length"):
        load._status_and_length(b"HTTP/1.1 500 Internal\r\n\r\n")


def test_the_load_generator_only_targets_loopback() -> None:
    with pytest.raises(SystemExit):
        load.main(["--url", "http://10.0.0.1:8000", "--model", "m", "--inputs", "x.npz",
                   "--concurrency", "1"])  # fmt: skip


def exported() -> ModelConfig:
    config = ModelConfig(name="m", max_batch_size=48)
    config.dynamic_batching.max_queue_delay_microseconds = 25_000
    config.instance_group.add(kind=ModelInstanceGroup.KIND_AUTO, count=2)
    return config


def test_variants_set_batching_graphs_and_one_instance() -> None:
    plain = variants.configure(exported(), Variant(batching=False, graphs=False), "gpu")
    assert not plain.HasField("dynamic_batching")
    assert not plain.HasField("optimization")
    assert [(g.kind, g.count) for g in plain.instance_group] == [(ModelInstanceGroup.KIND_GPU, 1)]
    graphs = variants.configure(exported(), Variant(batching=True, graphs=True), "cpu")
    assert graphs.dynamic_batching.max_queue_delay_microseconds == 25_000
    assert graphs.optimization.cuda.graphs
    assert [s.batch_size for s in graphs.optimization.cuda.graph_spec] == [1, 2, 4, 8, 16, 32, 48]
    assert graphs.instance_group[0].kind == ModelInstanceGroup.KIND_CPU


def test_a_variant_is_a_repository_of_its_own_with_the_model_s_files(tmp_path: Path) -> None:
    model_dir = tmp_path / "exports" / "ort-cuda-fp16" / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(b"onnx")
    (model_dir / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 8\n')
    repository = variants.build(model_dir, tmp_path / "v", Variant(True, True), "gpu")
    assert repository.name == "ort-cuda-fp16-b1g1"
    assert (repository / "m" / "1" / "model.onnx").read_bytes() == b"onnx"
    assert "graphs: true" in (repository / "m" / "config.pbtxt").read_text()
    assert variants.build(model_dir, tmp_path / "v", Variant(True, True), "gpu") == repository


def test_accuracy_figures() -> None:
    want = np.array([[10.0, -2.0, 0.001], [1.0, 5.0, 0.0]])
    got = want + np.array([[0.5, 0.0, 0.01], [0.0, -0.1, 0.0]])
    found = accuracy.measure(KEY, "logits", got, want)
    assert found.max_abs == pytest.approx(0.5)
    assert found.max_rel == pytest.approx(0.05)  # the 0.001 element is below 1 % of 10
    assert found.top1 == 1.0
    assert found.batch == 2


def test_accuracy_counts_rows_whose_class_changes() -> None:
    want = np.array([[1.0, 2.0], [3.0, 1.0]])
    got = np.array([[2.5, 2.0], [3.0, 1.0]])
    assert accuracy.measure(KEY, "logits", got, want).top1 == 0.5
    assert accuracy.measure(KEY, "y", np.ones(3), np.ones(3)).top1 is None
    with pytest.raises(ValueError, match="shape"):
        accuracy.measure(KEY, "y", np.ones(3), np.ones(4))


def test_export_arguments_name_the_factory_its_tensors_and_the_fp16_tolerance() -> None:
    from batchserve.zoo.digits_cnn import PIXEL_MAX

    assert networks.PIXEL_MAX == PIXEL_MAX
    digits = networks.export_args("digits_cnn", False, 64, 224)
    assert digits[:3] == ["bench.gpu.models:digits_cnn", "--factory-kwargs", '{"half": false}']
    assert "image:FP32:batch,1,8,8:0..16" in digits
    assert "--atol" not in digits
    resnet = networks.export_args("resnet50ish", True, 8, 64)
    assert "image:FP32:batch,3,64,64" in resnet
    assert resnet[resnet.index("--max-batch-size") + 1] == "8"
    assert resnet[-4:] == ["--atol", "0.05", "--rtol", "0.05"]


def test_the_accuracy_batch_is_the_same_on_every_run() -> None:
    first = networks.fixed_batch("digits_cnn", 8, 224)
    assert first.shape == (8, 1, 8, 8)
    assert first.min() >= 0
    assert first.max() <= 16
    assert np.array_equal(first, networks.fixed_batch("digits_cnn", 8, 224))
    assert networks.fixed_batch("resnet50ish", 2, 32).shape == (2, 3, 32, 32)


def test_the_resnet_is_resnet_50_sized_and_half_precision_keeps_fp32_edges() -> None:
    import torch

    from bench.gpu import models

    full = models.resnet50ish()
    assert sum(p.numel() for p in full.parameters()) == 25_557_032  # ResNet-50's count
    half = models.resnet50ish(half=True)
    with torch.no_grad():
        out = half(torch.zeros(1, 3, 32, 32))
    assert out.dtype == torch.float32
    assert out.shape == (1, 1000)
