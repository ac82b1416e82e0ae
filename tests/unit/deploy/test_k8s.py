"""The Kubernetes manifests: every variant renders offline and validates strictly, and what
they promise (ports, probes, drain time, scaling metric, GPUs) matches what the server does."""

from __future__ import annotations

import copy
import os
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from batchserve.core.cpu_budget import available_cpus
from batchserve.core.settings import Settings
from batchserve.models.repository import ModelRepository
from batchserve.proto.model_config_pb2 import ModelInstanceGroup
from batchserve.runtime.cpus import resolve_workers
from deploy_support import (
    COMPONENTS,
    DEPLOY,
    HPA_VARIANTS,
    K8S,
    KEDA_VARIANTS,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    REPO,
    URI,
    VARIANTS,
    Manifest,
    container,
    downward_env,
    env_values,
    health_statuses,
    load_yaml,
    metric_names,
    only,
    render,
    server_settings,
    settings_field,
    validate,
)
from dockerfile_support import image_user

GPU = "nvidia.com/gpu"
SERVER = "batchserve"
# Each overlay's CPU request in whole cores, and the workers `auto` makes of it.
CORES_AND_WORKERS = {"cpu": (2, 1), "gpu": (4, 3)}


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(params=HPA_VARIANTS)
def hpa_variant(request: pytest.FixtureRequest) -> str:
    """A variant the base's HorizontalPodAutoscaler scales."""
    name: str = request.param
    return name


def _pod(manifests: list[Manifest]) -> dict[str, Any]:
    pod: dict[str, Any] = only(manifests, "Deployment")["spec"]["template"]["spec"]
    return pod


def _server_config(manifests: list[Manifest]) -> dict[str, str]:
    """What the server's ConfigMaps (envFrom) set."""
    server = container(_pod(manifests), SERVER)
    maps = {m["metadata"]["name"]: m["data"] for m in manifests if m["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in server["envFrom"]:
        env |= maps[source["configMapRef"]["name"]]
    return env


def _settings(manifests: list[Manifest], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The server's settings in the pod: the ConfigMap it loads with envFrom, then its own
    env (which wins), the downward API's values included."""
    server = container(_pod(manifests), SERVER)
    env = _server_config(manifests) | env_values(server) | downward_env(server)
    return server_settings(server["command"], env, monkeypatch)


def _ports(container_spec: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container_spec["ports"]}


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly(
    rendered: dict[str, list[Manifest]], variant: str, version: str
) -> None:
    kinds = {m["kind"] for m in rendered[variant]}
    scaler = "ScaledObject" if variant in KEDA_VARIANTS else "HorizontalPodAutoscaler"
    assert {"Deployment", "Service", "ServiceMonitor", scaler} <= kinds
    assert {"PodDisruptionBudget", "ConfigMap"} <= kinds
    for manifest in rendered[variant]:
        validate(manifest, version)


def test_gpus_are_requested_only_by_the_gpu_overlay(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    pod = _pod(rendered[variant])
    resources = container(pod, SERVER)["resources"]
    if variant.startswith("gpu"):
        assert int(resources["limits"][GPU]) >= 1
        assert resources["requests"][GPU] == resources["limits"][GPU]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    else:
        assert not any(GPU in str(c.get("resources")) for c in pod["containers"])
        assert "nodeSelector" not in pod
        assert "tolerations" not in pod


def test_every_container_has_requests_and_limits(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    pod = _pod(rendered[variant])
    for spec in [*pod.get("initContainers", []), *pod["containers"]]:
        assert {"cpu", "memory"} <= spec["resources"]["requests"].keys(), spec["name"]
        assert {"cpu", "memory"} <= spec["resources"]["limits"].keys(), spec["name"]


def test_container_ports_are_where_the_server_listens(
    rendered: dict[str, list[Manifest]], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(rendered[variant], monkeypatch)
    assert settings.host == "0.0.0.0"
    ports = _ports(container(_pod(rendered[variant]), SERVER))
    expected = {"http": settings.http_port, "grpc": settings.grpc_port}
    assert ports == expected | {"metrics": settings.metrics_port}
    assert sorted(ports.values()) == [8000, 8001, 8002]


def test_the_server_reads_the_mounted_model_repository(
    rendered: dict[str, list[Manifest]], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(rendered[variant], monkeypatch)
    server = container(_pod(rendered[variant]), SERVER)
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    [repository] = settings.model_repository
    assert mounts[str(repository)] == "models"


def test_every_referenced_config_map_and_claim_is_rendered(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    pod = _pod(rendered[variant])
    names = {(m["kind"], m["metadata"]["name"]) for m in rendered[variant]}
    for spec in [*pod.get("initContainers", []), *pod["containers"]]:
        for source in spec.get("envFrom", []):
            if "configMapRef" in source:
                assert ("ConfigMap", source["configMapRef"]["name"]) in names, spec["name"]
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            assert ("PersistentVolumeClaim", claim) in names


def test_configmap_sets_only_server_settings(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    config = next(m for m in rendered[variant] if m["metadata"]["name"].startswith(SERVER + "-c"))
    assert config["data"]["BATCHSERVE_HOST"] == "0.0.0.0"
    for variable in config["data"]:
        settings_field(variable)


def test_workers_follow_the_pods_cpu_request(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    """BATCHSERVE_CPUS is the container's CPU request in whole cores (downward API, divisor
    1), and `auto` sizes the workers from it, whatever cores the node has."""
    server = container(_pod(rendered[variant]), SERVER)
    [cpus] = [e for e in server["env"] if e["name"] == "BATCHSERVE_CPUS"]
    assert cpus["valueFrom"] == {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}
    settings_field("BATCHSERVE_CPUS")
    config = _server_config(rendered[variant])
    assert "BATCHSERVE_CPUS" not in config, "the container's env would shadow it"
    cores = int(downward_env(server)["BATCHSERVE_CPUS"])
    env = config | env_values(server)
    workers = resolve_workers(env["BATCHSERVE_WORKERS"], available_cpus(cores))
    assert (cores, workers) == CORES_AND_WORKERS[variant.partition("+")[0]]


@pytest.mark.parametrize(("request_cpu", "cores"), [("500m", 1), ("1500m", 2), ("2", 2), (3, 3)])
def test_downward_api_rounds_the_cpu_request_up_to_whole_cores(
    request_cpu: str | int, cores: int
) -> None:
    spec = {
        "name": SERVER,
        "resources": {"requests": {"cpu": request_cpu}},
        "env": [
            {
                "name": "BATCHSERVE_CPUS",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}},
            }
        ],
    }
    assert downward_env(spec) == {"BATCHSERVE_CPUS": str(cores)}


@pytest.mark.anyio
async def test_probes_ask_real_health_routes_on_the_http_port(
    rendered: dict[str, list[Manifest]], variant: str, tmp_path: Path
) -> None:
    server = container(_pod(rendered[variant]), SERVER)
    probes = {
        kind: server[f"{kind}Probe"]["httpGet"] for kind in ("startup", "readiness", "liveness")
    }
    assert {p["port"] for p in probes.values()} == {"http"}
    assert probes["startup"]["path"] == probes["readiness"]["path"] == "/v2/health/ready"
    assert probes["liveness"]["path"] == "/v2/health/live"
    assert await health_statuses("/v2/health/ready", tmp_path) == (200, 503)
    assert await health_statuses("/v2/health/live", tmp_path) == (200, 200)


def test_startup_allows_minutes_to_load_models(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    probe = container(_pod(rendered[variant]), SERVER)["startupProbe"]
    minimum = 15 * 60 if variant.startswith("gpu") else 10 * 60
    assert probe["periodSeconds"] * probe["failureThreshold"] >= minimum


def test_grace_period_covers_pre_stop_delay_and_drain(
    rendered: dict[str, list[Manifest]], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = _pod(rendered[variant])
    settings = _settings(rendered[variant], monkeypatch)
    pre_stop = container(pod, SERVER)["lifecycle"]["preStop"]["sleep"]["seconds"]
    # the delay, then two waits of the timeout: HTTP clients closing, accepted requests
    drain = settings.shutdown_delay_seconds + 2 * settings.shutdown_timeout_seconds
    assert pre_stop > 0
    assert settings.shutdown_delay_seconds > 0
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain


def test_service_selects_the_pods_and_targets_their_ports(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    deployment = only(rendered[variant], "Deployment")
    service = only(rendered[variant], "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _matches(deployment["spec"]["selector"]["matchLabels"], labels)
    assert _matches(service["spec"]["selector"], labels)
    ports = _ports(container(deployment["spec"]["template"]["spec"], SERVER))
    for port in service["spec"]["ports"]:
        assert ports[port["targetPort"]] == port["port"], port["name"]
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "grpc", "metrics"}


def test_prometheus_scrapes_the_metrics_port(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    monitor = only(rendered[variant], "ServiceMonitor")
    service = only(rendered[variant], "Service")
    deployment = only(rendered[variant], "Deployment")
    assert _matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    target = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert (target["targetPort"], endpoint["path"]) == ("metrics", "/metrics")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    metrics_port = _ports(container(deployment["spec"]["template"]["spec"], SERVER))["metrics"]
    assert annotations["prometheus.io/port"] == str(metrics_port)


def test_autoscaler_scales_the_deployment_on_a_metric_the_server_exports(
    rendered: dict[str, list[Manifest]], hpa_variant: str, tmp_path: Path
) -> None:
    hpa = only(rendered[hpa_variant], "HorizontalPodAutoscaler")["spec"]
    deployment = only(rendered[hpa_variant], "Deployment")
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    [metric] = hpa["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] in metric_names(tmp_path)
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"


def test_adapter_rule_publishes_the_autoscalers_metric_per_pod(
    rendered: dict[str, list[Manifest]], hpa_variant: str
) -> None:
    hpa = only(rendered[hpa_variant], "HorizontalPodAutoscaler")["spec"]
    name = hpa["metrics"][0]["pods"]["metric"]["name"]
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    [rule] = values["rules"]["custom"]
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["name"]["as"] == name
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }


def test_disruption_budget_covers_the_pods_and_allows_drains(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    budget = only(rendered[variant], "PodDisruptionBudget")["spec"]
    deployment = only(rendered[variant], "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _matches(budget["selector"]["matchLabels"], labels)
    assert budget["maxUnavailable"] >= 1
    if variant in KEDA_VARIANTS:
        fewest = only(rendered[variant], "ScaledObject")["spec"]["minReplicaCount"]
    else:
        fewest = only(rendered[variant], "HorizontalPodAutoscaler")["spec"]["minReplicas"]
    assert fewest > budget["maxUnavailable"]


def test_pods_run_locked_down_as_the_images_user(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    pod = _pod(rendered[variant])
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.gpu"):
        user = image_user(DEPLOY / "docker" / dockerfile)
        assert f"{security['runAsUser']}:{security['runAsGroup']}" == user
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for spec in [*pod.get("initContainers", []), *pod["containers"]]:
        context = spec["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, spec["name"]
        assert context["readOnlyRootFilesystem"] is True, spec["name"]
        assert context["capabilities"] == {"drop": ["ALL"]}, spec["name"]


def test_tmp_is_the_writable_scratch_space(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    pod = _pod(rendered[variant])
    volumes = {v["name"]: v for v in pod["volumes"]}
    for spec in [*pod.get("initContainers", []), *pod["containers"]]:
        mount = next(m for m in spec["volumeMounts"] if m["mountPath"] == "/tmp")
        assert "emptyDir" in volumes[mount["name"]], spec["name"]


def test_images_are_pinned(rendered: dict[str, list[Manifest]], variant: str) -> None:
    pod = _pod(rendered[variant])
    for spec in [*pod.get("initContainers", []), *pod["containers"]]:
        name, _, tag = spec["image"].rpartition(":")
        assert name, f"{spec['image']} has no tag"
        assert tag not in ("", "latest"), spec["image"]


def test_models_come_from_the_claim_or_from_object_storage(
    rendered: dict[str, list[Manifest]], variant: str
) -> None:
    pod = _pod(rendered[variant])
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    claims = [m for m in rendered[variant] if m["kind"] == "PersistentVolumeClaim"]
    if not variant.endswith("+object-storage"):
        assert models["persistentVolumeClaim"]["claimName"] == claims[0]["metadata"]["name"]
        assert "initContainers" not in pod
        return
    assert set(models) == {"name", "emptyDir"}
    assert claims == []
    [fetch] = pod["initContainers"]
    assert fetch["command"][:3] == ["aws", "s3", "sync"]
    assert fetch["args"] == ["$(MODEL_REPOSITORY_URI)", "/models"]
    writable = {m["mountPath"] for m in fetch["volumeMounts"] if not m.get("readOnly")}
    assert "/models" in writable
    maps = {m["metadata"]["name"]: m["data"] for m in rendered[variant] if m["kind"] == "ConfigMap"}
    sources = [s["configMapRef"]["name"] for s in fetch["envFrom"] if "configMapRef" in s]
    assert [maps[name].get("MODEL_REPOSITORY_URI") for name in sources] == [URI]


def test_overlays_and_components_are_the_variants_tested() -> None:
    assert sorted(p.name for p in (K8S / "overlays").iterdir()) == sorted(OVERLAYS)
    assert sorted(p.name for p in (K8S / "components").iterdir()) == sorted(COMPONENTS)


def test_grpc_connections_are_aged_so_that_new_pods_get_their_share(
    rendered: dict[str, list[Manifest]], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients reconnect (and so reach pods a scale-out added) before the autoscaler could
    judge those pods idle and remove them: within the scale-down window, jitter included."""
    settings = _settings(rendered[variant], monkeypatch)
    window = _HPA["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    assert settings.grpc_max_connection_age_ms is not None
    assert 1.1 * settings.grpc_max_connection_age_ms / 1000 <= window  # grpc's 10 % jitter
    # Without a grace, one open stream would keep its connection for ever.
    assert settings.grpc_max_connection_age_grace_ms is not None
    assert settings.grpc_max_connection_age_grace_ms / 1000 <= settings.shutdown_timeout_seconds


def test_each_overlay_serves_its_own_configs_of_the_one_repository(
    rendered: dict[str, list[Manifest]], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overlays set --model-config-name, and the shipped repository has a config of
    that name placing digits_cnn on the overlay's kind of device."""
    overlay = variant.partition("+")[0]
    settings = _settings(rendered[variant], monkeypatch)
    assert settings.model_config_name == overlay
    repository = ModelRepository(REPO / "model_repo", settings.model_config_name)
    digits = repository.resolve("digits_cnn")
    assert digits.config_file == f"digits_cnn/configs/{overlay}.pbtxt"
    kind = ModelInstanceGroup.KIND_GPU if overlay == "gpu" else ModelInstanceGroup.KIND_CPU
    assert {group.kind for group in digits.config.instance_group} == {kind}


# KEDA -------------------------------------------------------------------------------------
_HPA: dict[str, Any] = only(load_yaml(K8S / "base" / "hpa.yaml"), "HorizontalPodAutoscaler")["spec"]
"""The base's autoscaler, which the KEDA component must be equivalent to."""
PROMQL_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@pytest.fixture(params=KEDA_VARIANTS)
def keda_variant(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def _scaled_object(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "ScaledObject")["spec"]
    return spec


def _trigger(manifests: list[Manifest]) -> dict[str, Any]:
    """The one trigger: KEDA's prometheus scaler."""
    [trigger] = _scaled_object(manifests)["triggers"]
    assert trigger["type"] == "prometheus"
    found: dict[str, Any] = trigger
    return found


def test_keda_variants_scale_with_a_scaled_object_instead_of_the_hpa(
    rendered: dict[str, list[Manifest]], keda_variant: str
) -> None:
    """KEDA makes an HPA of its own: the base's must be gone, or two would fight."""
    kinds = [m["kind"] for m in rendered[keda_variant]]
    assert "HorizontalPodAutoscaler" not in kinds
    assert kinds.count("ScaledObject") == 1
    for version in KUBERNETES_VERSIONS:
        validate(only(rendered[keda_variant], "ScaledObject"), version)


def test_scaled_object_scales_the_rendered_deployment(
    rendered: dict[str, list[Manifest]], keda_variant: str
) -> None:
    target = _scaled_object(rendered[keda_variant])["scaleTargetRef"]
    deployment = only(rendered[keda_variant], "Deployment")
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    assert target["name"] == deployment["metadata"]["name"]
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"


def test_scaled_object_follows_a_renamed_deployment(tmp_path: Path) -> None:
    """kustomize is told that scaleTargetRef names the Deployment, so an overlay's
    namePrefix renames both (it would otherwise leave KEDA scaling nothing)."""
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namePrefix": "team-",
        "resources": [os.path.relpath(K8S / "overlays" / "cpu", tmp_path)],
        "components": [os.path.relpath(K8S / "components" / "keda", tmp_path)],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    manifests = render(tmp_path)
    deployment = only(manifests, "Deployment")["metadata"]["name"]
    assert deployment == "team-batchserve"
    assert _scaled_object(manifests)["scaleTargetRef"]["name"] == deployment


def test_scaled_object_queries_a_metric_the_server_exports(
    rendered: dict[str, list[Manifest]], keda_variant: str, tmp_path: Path
) -> None:
    trigger = _trigger(rendered[keda_variant])
    query = trigger["metadata"]["query"]
    named = {name for name in PROMQL_NAME.findall(query) if name.startswith("batchserve_")}
    assert named == {_HPA["metrics"][0]["pods"]["metric"]["name"]}, query
    assert named <= metric_names(tmp_path)
    # KEDA's prometheus scaler refuses a result of more than one series: sum the pods.
    assert query.startswith("sum(")
    assert trigger["metadata"]["serverAddress"].startswith("http")


def test_scaled_object_is_the_hpas_equivalent(
    rendered: dict[str, list[Manifest]], keda_variant: str
) -> None:
    """Same bounds, pace and target: AverageValue over the summed per-pod saturation wants
    ceil(sum / threshold) pods, as the HPA's Pods metric at the same average value does."""
    spec = _scaled_object(rendered[keda_variant])
    trigger = _trigger(rendered[keda_variant])
    target = _HPA["metrics"][0]["pods"]["target"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
        _HPA["minReplicas"],
        _HPA["maxReplicas"],
    )
    # The CRD's CEL rule, which the JSON schema cannot express.
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == _HPA["behavior"]
    assert (target["type"], trigger["metricType"]) == ("AverageValue", "AverageValue")
    assert Decimal(trigger["metadata"]["threshold"]) == _quantity(target["averageValue"])
    # An empty result is an error (the HPA holds), not 0 (shrink to the minimum).
    assert trigger["metadata"]["ignoreNullValues"] == "false"


def _quantity(text: str) -> Decimal:
    """A Kubernetes quantity such as 600m, as a number."""
    return Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)


def _edited(manifests: list[Manifest], edit: Any) -> Manifest:
    scaled = copy.deepcopy(only(manifests, "ScaledObject"))
    edit(scaled["spec"])
    return scaled


@pytest.mark.parametrize(
    ("mistake", "edit"),
    [
        ("a count written as text", lambda spec: spec.update(minReplicaCount="2")),
        (
            "a trigger setting that is not text (KEDA's metadata is a string map)",
            lambda spec: spec["triggers"][0]["metadata"].update(threshold=0.6),
        ),
        ("a misspelt field", lambda spec: spec.update(pollingIntervall=15)),
        ("a trigger without its type", lambda spec: spec["triggers"][0].pop("type")),
        ("a negative cooldown", lambda spec: spec.update(cooldownPeriod=-1)),
    ],
)
def test_the_scaled_object_schema_check_refuses_mistakes(
    rendered: dict[str, list[Manifest]], mistake: str, edit: Any
) -> None:
    """The check is not vacuous: the rendered object passes, each broken copy fails."""
    manifests = rendered["cpu+keda"]
    validate(only(manifests, "ScaledObject"), KUBERNETES_VERSIONS[0])
    with pytest.raises(jsonschema.ValidationError):
        validate(_edited(manifests, edit), KUBERNETES_VERSIONS[0])
