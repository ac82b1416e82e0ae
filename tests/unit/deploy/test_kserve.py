"""The KServe runtime and its example InferenceServices: valid against the CRD schemas, and
the runtime's container serves the models KServe mounts, on the ports KServe expects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from batchserve.core.cpu_budget import available_cpus
from batchserve.core.settings import Settings
from batchserve.runtime.cpus import resolve_workers
from deploy_support import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    Manifest,
    downward_env,
    env_values,
    load_yaml,
    server_settings,
    settings_field,
    validate,
)
from dockerfile_support import parse_dockerfile, server_env

KSERVE = DEPLOY / "kserve"
KSERVE_MODEL_DIR = Path("/mnt/models")
KSERVE_HTTP_PORT = 8080  # the container port KServe routes to unless a model declares one
KSERVE_GRPC_PORT = 9000  # what KServe's own v2 runtimes (Triton) listen on for gRPC


def _one(name: str) -> Manifest:
    [manifest] = load_yaml(KSERVE / name)
    return manifest


@pytest.fixture
def runtime() -> Manifest:
    return _one("servingruntime.yaml")


@pytest.fixture
def runtime_container(runtime: Manifest) -> dict[str, Any]:
    [container] = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    return dict(container)


@pytest.fixture
def settings(runtime_container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    env = env_values(runtime_container) | downward_env(runtime_container)
    return server_settings(runtime_container["command"], env, monkeypatch)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "name", ["servingruntime.yaml", "inferenceservice.yaml", "inferenceservice-grpc.yaml"]
)
def test_manifest_validates_strictly(name: str, version: str) -> None:
    validate(_one(name), version)


def test_every_manifest_is_tested() -> None:
    names = {"servingruntime.yaml", "inferenceservice.yaml", "inferenceservice-grpc.yaml"}
    assert {p.name for p in KSERVE.glob("*.yaml")} == names


def test_runtime_serves_onnx_over_both_v2_protocols(runtime: Manifest) -> None:
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    [onnx] = [f for f in spec["supportedModelFormats"] if f["name"] == "onnx"]
    assert onnx["autoSelect"] is True


def test_server_reads_kserves_model_directory_on_kserves_ports(settings: Settings) -> None:
    assert settings.model_repository == (KSERVE_MODEL_DIR,)
    assert settings.host == "0.0.0.0"
    assert (settings.http_port, settings.grpc_port) == (KSERVE_HTTP_PORT, KSERVE_GRPC_PORT)


KSERVE_TRITON_ARGS = (
    "tritonserver", "--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080",
    "--allow-grpc=true", "--allow-http=true",
)  # fmt: skip
"""The container args of KServe's own Triton runtime (config/runtimes/kserve-tritonserver.yaml),
written for Triton's image, whose entrypoint runs its arguments."""


def test_kserves_triton_runtime_runs_the_image_as_it_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With batchserve's image in place of Triton's, Kubernetes appends the runtime's args to
    the image's entrypoint; they must start the server KServe expects."""
    final = parse_dockerfile(DEPLOY / "docker" / "Dockerfile.cpu")[-1]
    entrypoint = final.last("ENTRYPOINT")
    image = server_env(final)
    settings = server_settings([*entrypoint.value, *KSERVE_TRITON_ARGS], image, monkeypatch)
    assert settings.model_repository == (KSERVE_MODEL_DIR,), "KServe's store alone"
    assert settings.host == "0.0.0.0"
    assert (settings.http_port, settings.grpc_port) == (KSERVE_HTTP_PORT, KSERVE_GRPC_PORT)


def test_kserve_scrapes_the_metrics_port(runtime: Manifest, settings: Settings) -> None:
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(settings.metrics_port)
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_workers_follow_the_containers_cpu_request(runtime_container: dict[str, Any]) -> None:
    """BATCHSERVE_CPUS is the container's CPU request in whole cores (downward API, divisor
    1), and `auto` sizes the workers from it: the runtime's own 2 CPUs make one worker."""
    [cpus] = [e for e in runtime_container["env"] if e["name"] == "BATCHSERVE_CPUS"]
    assert cpus["valueFrom"] == {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}
    settings_field("BATCHSERVE_CPUS")
    cores = int(downward_env(runtime_container)["BATCHSERVE_CPUS"])
    workers = env_values(runtime_container)["BATCHSERVE_WORKERS"]
    assert (cores, resolve_workers(workers, available_cpus(cores))) == (2, 1)


def test_readiness_is_the_images_health_check_on_the_http_port(
    runtime_container: dict[str, Any], settings: Settings
) -> None:
    """The probe runs the image's HEALTHCHECK command, which reads BATCHSERVE_HTTP_PORT from
    the same environment as the server (test_dockerfiles proves it asks a real route)."""
    healthcheck = parse_dockerfile(DEPLOY / "docker" / "Dockerfile.cpu")[-1].last("HEALTHCHECK")
    probe = runtime_container["readinessProbe"]["exec"]["command"]
    assert probe == list(healthcheck.value[1:])
    assert env_values(runtime_container)["BATCHSERVE_HTTP_PORT"] == str(settings.http_port)


def test_runtime_container_is_locked_down(runtime_container: dict[str, Any]) -> None:
    context = runtime_container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in runtime_container["volumeMounts"]}
    assert "/tmp" in mounts
    assert {"cpu", "memory"} <= runtime_container["resources"]["limits"].keys()


@pytest.mark.parametrize("name", ["inferenceservice.yaml", "inferenceservice-grpc.yaml"])
def test_inference_services_select_this_runtime(runtime: Manifest, name: str) -> None:
    model = _one(name)["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {
        f["name"] for f in runtime["spec"]["supportedModelFormats"]
    }
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


def test_grpc_service_routes_to_the_grpc_port(settings: Settings) -> None:
    model = _one("inferenceservice-grpc.yaml")["spec"]["predictor"]["model"]
    assert model["protocolVersion"] == "grpc-v2"
    [port] = model["ports"]
    assert (port["name"], port["containerPort"]) == ("h2c", settings.grpc_port)
