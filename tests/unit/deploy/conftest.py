"""Every Kustomize variant the repository offers, rendered once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from deploy_support import COMPONENTS, K8S, OVERLAYS, URI, Manifest, render


def _user_overlay(overlay: str, component: str, workdir: Path) -> Path:
    """A user's overlay as deploy/README.md writes it: one of ours and a component, with the
    repository's address for object-storage (kustomize wants relative paths)."""
    workdir.mkdir()
    kustomization: dict[str, object] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / overlay, workdir)],
        "components": [os.path.relpath(K8S / "components" / component, workdir)],
    }
    if component == "object-storage":
        kustomization["configMapGenerator"] = [
            {"name": "batchserve-object-storage", "literals": [f"MODEL_REPOSITORY_URI={URI}"]}
        ]
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return workdir


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Manifest]]:
    variants = {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}
    for component in COMPONENTS:
        for overlay in OVERLAYS:
            workdir = tmp_path_factory.mktemp("kustomize") / overlay
            variants[f"{overlay}+{component}"] = render(_user_overlay(overlay, component, workdir))
    return variants
