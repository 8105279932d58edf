"""The alert rules read the series a gateway really emits: an engine busy past the queue's deadline, scraped
from a live gateway's ``/metrics`` and fed to ``promtool test rules``, pages under its own outcome."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from deploy.monitoring.prometheusrule import RULES
from gateway.http.app import create_app
from tests.monitoring.promql import run_promtool
from tests.reliability.test_engine_busy import BODY, VERDICT, VLLM_QUEUE_FULL, Engines, settings

FAILING_DESCRIPTION = "Server-side failures (not the caller's): these keyframes get no verdict."


def promql_selector(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


async def test_an_engine_busy_past_the_deadline_fires_the_failing_alert_with_the_outcome_it_reads(
    tmp_path: Path,
) -> None:
    engines = Engines(a=[(200, VERDICT)] * 3 + [(503, VLLM_QUEUE_FULL)])  # three answers, then busy
    app = create_app(settings(admission={"queue_timeout_s": 0.3}, shaping={"verdict_cache_ttl_s": 0}),
                     engine_transport=httpx.MockTransport(engines))
    async with AsyncTestClient(app, timeout=30) as client:
        statuses = [(await client.post("/v1/moderations", json=BODY)).status_code for _ in range(4)]
        exposition = (await client.get("/metrics")).text
    assert statuses == [200, 200, 200, 429]

    scraped = {  # each modgate_requests_total series, as the gateway wrote it
        promql_selector(sample.name, {**sample.labels, "instance": "gw-a", "job": "modgate"}): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "modgate_requests_total"
    }
    assert sum(scraped.values()) == 4
    (tmp_path / "scraped.test.yaml").write_text(yaml.safe_dump({
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [  # the same mix every minute for 20 minutes
                {"series": series, "values": f"0+{value:g}x20"} for series, value in scraped.items()
            ],
            "alert_rule_test": [{
                "eval_time": "15m",
                "alertname": "ModgateRequestsFailing",
                "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "outcome": "engine_busy"},
                    "exp_annotations": {
                        "summary": "25% of moderation requests fail with engine_busy.",
                        "description": FAILING_DESCRIPTION,
                        "runbook_url": "docs/alerts.md#modgaterequestsfailing",
                    },
                }],
            }],
        }],
    }))

    result = run_promtool("test", "rules", "scraped.test.yaml", cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
