"""Redis behind Sentinel (a real primary, two replicas and three sentinels): the primary killed while jobs,
policy flips and traffic run. No job accepted is lost or completed twice, requests keep being answered,
flips work again once the sentinels name the new primary and both gateways converge on one version, and
once every gateway takes its leases from the new primary the engine's cap of 8 holds again
(bench/failover.py runs the same and prints the timeline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.failover import options, run
from gateway.settings import Settings
from gateway.state import RedisUrlError, SentinelTarget, check_redis_url, parse_sentinel_url


def test_a_killed_primary_behind_sentinel_loses_no_job_and_the_cap_holds_after(tmp_path: Path) -> None:
    report = run(options(["--clients", "6", "--before-s", "6", "--after-s", "10",
                          "--work-dir", str(tmp_path)]))

    line, jobs, policy = report["timeline"], report["jobs"], report["policy"]
    seen = f"the failover's report: {report}"  # every figure, when an assertion fails
    assert line["new_primary_s"] is not None, seen
    assert jobs["accepted"] > 0, seen
    assert jobs["lost"] == 0, seen
    assert jobs["completed_twice"] == 0, seen
    assert line["requests_after"] > 0, seen
    assert line["requests_failed_after"] == 0, seen  # serving never needed Redis
    assert line["first_flip_s"] is not None, seen  # a flip asked after the promotion succeeded
    assert policy["converged_version"] is not None, seen
    assert line["first_lease_s"] is not None, seen  # a lease the new primary did not inherit
    assert line["local_caps_until_s"] is not None, seen  # every gateway back on shared caps
    assert line["engine_samples_after"] > 0, seen  # the cap below was watched, not vacuous
    assert line["engine_peak_after"] <= report["setup"]["cap"], seen

def test_a_sentinel_url_names_its_sentinels_service_and_database() -> None:
    assert parse_sentinel_url("redis+sentinel://10.0.0.1:26379,sentinel-2:26380/modgate/3") == SentinelTarget(
        (("10.0.0.1", 26379), ("sentinel-2", 26380)), "modgate", 3
    )
    assert parse_sentinel_url("redis+sentinel://:s3cret@h:26379/modgate").password == "s3cret"
    assert parse_sentinel_url("redis+sentinel://h:26379/modgate").db == 0


@pytest.mark.parametrize("url", [
    "redis+sentinel://h/modgate", "redis+sentinel://h:26379", "redis+sentinel://h:26379/modgate/x",
    "http://h:6379/0",
])
def test_a_malformed_redis_url_is_refused_at_start(url: str) -> None:
    with pytest.raises(RedisUrlError):
        check_redis_url(url)
    with pytest.raises(ValueError, match="redis"):
        Settings(redis={"url": url})


def test_the_sentinel_overlay_points_the_gateways_at_three_sentinels_and_waits_for_a_replica() -> None:
    overlay = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "overlays" / "sentinel"
    patch = yaml.safe_load((overlay / "gateway-sentinel-url.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    (variable,) = container["env"]
    target = parse_sentinel_url(variable["value"])
    config = yaml.safe_load((overlay / "gateway-config.yaml").read_text())["data"]

    assert len(target.sentinels) == 3
    assert target.service == "modgate"
    assert int(config["MODGATE_JOBS__WAIT_REPLICAS"]) >= 1


def test_the_sentinel_overlays_weekly_report_finds_the_primary_through_the_same_sentinels() -> None:
    overlay = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "overlays" / "sentinel"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    patches = {entry["path"] for entry in kustomization["patches"]}
    gateway = yaml.safe_load((overlay / "gateway-sentinel-url.yaml").read_text())
    report = yaml.safe_load((overlay / "quality-report-sentinel-url.yaml").read_text())
    (gateway_container,) = gateway["spec"]["template"]["spec"]["containers"]
    (report_container,) = report["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    policy = yaml.safe_load((overlay / "sentinel-networkpolicy.yaml").read_text())
    allowed = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for rule in policy["spec"]["ingress"] for peer in rule["from"]}

    assert "quality-report-sentinel-url.yaml" in patches
    assert (report["kind"], report["metadata"]["name"]) == ("CronJob", "modgate-quality-report")
    assert report_container["env"] == gateway_container["env"]
    assert parse_sentinel_url(report_container["env"][0]["value"]).service == "modgate"
    assert "quality-report" in allowed
