"""deploy/k8s parses, and its names, labels, ports and settings line up (no cluster here to apply it to).

tests/deploy/test_k8s_builds.py builds each kustomization with the real kubectl and validates the result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
BASE = K8S / "base"
SCHEDULE_CRONJOB = K8S.parent / "schedule" / "quality-report-cronjob.yaml"

Manifest = dict[str, Any]


def load(path: Path) -> list[Manifest]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def base() -> dict[tuple[str, str], Manifest]:
    """The kustomization's resources by (kind, name)."""
    kustomization = load(BASE / "kustomization.yaml")[0]
    manifests: dict[tuple[str, str], Manifest] = {}
    for resource in kustomization["resources"]:
        for manifest in load(BASE / resource):
            manifests[(manifest["kind"], manifest["metadata"]["name"])] = manifest
    return manifests


def one(kind: str, name: str) -> Manifest:
    return base()[(kind, name)]


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"]["spec"])


def pod_labels(workload: Manifest) -> dict[str, str]:
    spec = workload["spec"]["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else workload["spec"]
    return dict(spec["template"]["metadata"]["labels"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def redis_url_source(container: Manifest) -> dict[str, str]:
    """Where a container's MODGATE_REDIS__URL comes from (a Secret's key)."""
    env = container["env"]
    (source,) = [v["valueFrom"]["secretKeyRef"] for v in env if v["name"] == "MODGATE_REDIS__URL"]
    return dict(source)


def example_secrets() -> dict[str, dict[str, str]]:
    return {s["metadata"]["name"]: s["stringData"] for s in load(K8S / "secret.example.yaml")}


@pytest.mark.parametrize("path", sorted(K8S.rglob("*.yaml")), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_parses_and_names_its_kind(path: Path) -> None:
    documents = load(path)
    assert documents
    for document in documents:
        assert document["apiVersion"]
        assert document["kind"]
        if document["kind"] != "Kustomization":
            assert document["metadata"]["name"].startswith("modgate")


def test_the_base_lists_every_manifest_in_its_folder_and_the_secret_example_lies_outside_it() -> None:
    listed = set(load(BASE / "kustomization.yaml")[0]["resources"])
    present = {path.name for path in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert (K8S / "secret.example.yaml").is_file()
    assert listed == present
    assert {kind for kind, _ in base()} == {
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "StatefulSet",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "CronJob",
    }


def test_the_gateway_service_reaches_the_deployments_named_port() -> None:
    deployment, service = one("Deployment", "modgate-gateway"), one("Service", "modgate-gateway")
    assert deployment["spec"]["selector"]["matchLabels"] == pod_labels(deployment)
    assert selects(service["spec"]["selector"], pod_labels(deployment))
    (container,) = pod_spec(deployment)["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports
    assert str(ports["http"]) == one("ConfigMap", "modgate-gateway")["data"]["MODGATE_SERVER__PORT"]


def test_the_gateway_probes_readiness_on_readyz_and_liveness_on_healthz() -> None:
    (container,) = pod_spec(one("Deployment", "modgate-gateway"))["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("Deployment", "modgate-gateway"),
        ("StatefulSet", "modgate-redis"),
        ("CronJob", "modgate-quality-report"),
    ],
)
def test_every_pod_runs_as_non_root_without_privilege_escalation(kind: str, name: str) -> None:
    spec = pod_spec(one(kind, name))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for container in spec["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_gateway_reads_its_environment_from_the_configmap_and_secrets_that_exist() -> None:
    (container,) = pod_spec(one("Deployment", "modgate-gateway"))["containers"]
    sources = {next(iter(source)): next(iter(source.values()))["name"] for source in container["envFrom"]}
    assert ("ConfigMap", sources["configMapRef"]) in base()
    secrets = example_secrets()
    assert sources["secretRef"] in secrets
    redis_url = redis_url_source(container)
    assert redis_url["key"] in secrets[redis_url["name"]]
    (report,) = pod_spec(one("CronJob", "modgate-quality-report"))["containers"]
    assert redis_url_source(report) == redis_url  # the gateways and the weekly report read the same Redis


def test_the_gateway_configuration_is_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    environment = {
        **one("ConfigMap", "modgate-gateway")["data"],
        **example_secrets()["modgate-gateway"],
        "MODGATE_REDIS__URL": example_secrets()["modgate-redis"]["url"],
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert len(settings.engine_urls()) == 2
    assert [settings.engine_cap(url) for url in settings.engine_urls()] == [8, 8]
    assert settings.leases.renew_every_s < settings.leases.ttl_s


def test_the_redis_url_names_the_redis_service_and_its_port() -> None:
    service = one("Service", "modgate-redis")
    url = example_secrets()["modgate-redis"]["url"]
    assert url == f"redis://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/0"
    statefulset = one("StatefulSet", "modgate-redis")
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service["spec"]["selector"], pod_labels(statefulset))
    (container,) = pod_spec(statefulset)["containers"]
    assert service["spec"]["ports"][0]["targetPort"] in {port["name"] for port in container["ports"]}


def test_redis_persists_every_write_to_an_append_only_file_on_its_own_volume() -> None:
    statefulset = one("StatefulSet", "modgate-redis")
    (container,) = pod_spec(statefulset)["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == data_dir


def test_only_the_gateway_and_the_report_may_reach_redis() -> None:
    policy = one("NetworkPolicy", "modgate-redis")
    redis_pods = pod_labels(one("StatefulSet", "modgate-redis"))
    assert selects(policy["spec"]["podSelector"]["matchLabels"], redis_pods)
    allowed = [peer["podSelector"]["matchLabels"] for peer in policy["spec"]["ingress"][0]["from"]]
    for kind, name in (("Deployment", "modgate-gateway"), ("CronJob", "modgate-quality-report")):
        assert any(selects(labels, pod_labels(one(kind, name))) for labels in allowed)
    assert len(allowed) == 2


def test_the_autoscaler_and_disruption_budget_target_the_gateway() -> None:
    deployment = one("Deployment", "modgate-gateway")
    hpa = one("HorizontalPodAutoscaler", "modgate-gateway")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    pdb = one("PodDisruptionBudget", "modgate-gateway")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(deployment))
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_the_optional_overlay_scales_on_a_metric_the_gateway_exports() -> None:
    overlay = K8S / "overlays" / "queued-metric"
    kustomization = load(overlay / "kustomization.yaml")[0]
    assert kustomization["resources"] == ["../../base"]
    (patch,) = [load(overlay / item["path"])[0] for item in kustomization["patches"]]
    assert (patch["kind"], patch["metadata"]["name"]) == ("HorizontalPodAutoscaler", "modgate-gateway")
    metrics = patch["spec"]["metrics"]  # a list without a merge key: the patch replaces it, so CPU stays in
    assert {m["type"] for m in metrics} == {"Resource", "Pods"}
    (queued,) = [m["pods"]["metric"]["name"] for m in metrics if m["type"] == "Pods"]
    exported = generate_latest(GatewayMetrics().registry).decode()
    assert f"# TYPE {queued} gauge" in exported


def test_the_weekly_report_cronjob_is_deploy_schedules_and_its_volume_is_claimed() -> None:
    (copy,) = load(BASE / "quality-report-cronjob.yaml")
    assert copy == load(SCHEDULE_CRONJOB)[0]
    assert copy["spec"]["schedule"] == "15 6 * * 1"
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod_spec(copy)["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims <= {name for kind, name in base() if kind == "PersistentVolumeClaim"}
