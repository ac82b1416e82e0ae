"""Every Kustomize variant the repository offers, rendered once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from deploy_support import K8S, OVERLAYS, URI, Manifest, render


def _with_object_storage(overlay: str, workdir: Path) -> Path:
    """A user's overlay as deploy/README.md writes it: one of ours, the object-storage
    component and the repository's address (kustomize wants relative paths)."""
    workdir.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "overlays" / overlay, workdir)],
        "components": [os.path.relpath(K8S / "components" / "object-storage", workdir)],
        "configMapGenerator": [
            {"name": "batchserve-object-storage", "literals": [f"MODEL_REPOSITORY_URI={URI}"]}
        ],
    }
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return workdir


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Manifest]]:
    variants = {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}
    for overlay in OVERLAYS:
        workdir = tmp_path_factory.mktemp("kustomize") / overlay
        variants[f"{overlay}+object-storage"] = render(_with_object_storage(overlay, workdir))
    return variants
