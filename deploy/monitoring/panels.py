"""The dashboard's panels, row by row: what each shows, in which unit, from which PromQL (declared once here).

deploy/monitoring/dashboard.py builds them into Grafana's JSON; the tests parse each query with promtool
and check that every metric it names is in a running gateway's ``/metrics``. Rate windows are a fixed
``[5m]``, not Grafana's ``$__rate_interval``: the same text then parses in promtool and evaluates in any
Prometheus, as the rules do. ``$instance`` selects gateway replicas (all by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What selects the gateway replicas in every query.
SEL = 'instance=~"$instance"'
# The latency objective the alert rules hold (deploy/monitoring/modgate-rules.yaml): 99 % within 15 s.
SLO_BUDGET = 0.01


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression of a panel and how its series are named in the legend."""

    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """One panel: what it shows, in which unit, from which queries."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: Literal["timeseries", "stat"] = "timeseries"
    width: int = 8
    max_value: float | None = None


def q(expr: str, legend: str = "") -> Query:
    """A query (``legend`` in Grafana's ``{{label}}`` form)."""
    return Query(expr, legend)


def _quantile(quantile: float, metric: str, by: str = "le") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}) (rate({metric}_bucket{{{SEL}}}[5m])))"


def _rate(metric: str, by: str | None = None, matcher: str = "") -> str:
    labels = f"{SEL}, {matcher}" if matcher else SEL
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{labels}}}[5m]))"


ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    (
        "Overview",
        (
            PanelSpec(
                "Keyframes a minute",
                "Keyframes answered per minute, live or for a job, all replicas (the business needs 45).",
                "short",
                (q(f"60 * {_rate('modgate_tenant_frames_total')}"),),
                kind="stat",
                width=4,
            ),
            PanelSpec(
                "End-to-end p95",
                "95th percentile of a keyframe's end-to-end latency.",
                "s",
                (q(_quantile(0.95, "modgate_request_seconds")),),
                kind="stat",
                width=4,
            ),
            PanelSpec(
                "Latency SLO burn (1h)",
                "Share of keyframes over 15 s in the last hour / the 1 % budget: "
                "above 14.4 together with the 5-minute window, ModgateLatencyBudgetBurnFast pages.",
                "short",
                (q(f"modgate:request_slo_misses:ratio_rate1h / {SLO_BUDGET}"),),
                kind="stat",
                width=4,
            ),
            PanelSpec(
                "Engines up",
                "Engines whose circuit lets calls through, out of all, per replica.",
                "short",
                (q(f"sum by (instance) (modgate_engine_up{{{SEL}}})", "{{instance}}"),),
                kind="stat",
                width=4,
            ),
            PanelSpec(
                "Queue fill",
                "Requests waiting for a slot / the queue's size (at 1: 429 overloaded).",
                "percentunit",
                (q(f"max(modgate_engine_queued{{{SEL}}} / modgate_engine_queue_size{{{SEL}}})"),),
                kind="stat",
                width=4,
                max_value=1,
            ),
            PanelSpec(
                "Failing requests",
                "Share of live moderation requests answered with anything but ok.",
                "percentunit",
                (
                    q(
                        _rate("modgate_requests_total", matcher='outcome!="ok"')
                        + " / "
                        + _rate("modgate_requests_total")
                    ),
                ),
                kind="stat",
                width=4,
                max_value=1,
            ),
        ),
    ),
    (
        "Latency",
        (
            PanelSpec(
                "End to end",
                "What callers wait for, per keyframe of a live request.",
                "s",
                (
                    q(_quantile(0.5, "modgate_request_seconds"), "p50"),
                    q(_quantile(0.95, "modgate_request_seconds"), "p95"),
                    q(_quantile(0.99, "modgate_request_seconds"), "p99"),
                ),
            ),
            PanelSpec(
                "Where the time goes (p95)",
                "Queue wait, image shaping, engine time to first token, decode.",
                "s",
                (
                    q(_quantile(0.95, "modgate_queue_wait_seconds"), "queue wait"),
                    q(_quantile(0.95, "modgate_shaping_seconds"), "shaping"),
                    q(_quantile(0.95, "modgate_engine_ttft_seconds"), "TTFT"),
                    q(_quantile(0.95, "modgate_engine_decode_seconds"), "decode"),
                ),
            ),
            PanelSpec(
                "Latency budget burn rate",
                "Keyframes over 15 s / the 1 % budget, by window (1 = the budget lasts exactly 30 days).",
                "short",
                (
                    q(f"modgate:request_slo_misses:ratio_rate5m / {SLO_BUDGET}", "5m"),
                    q(f"modgate:request_slo_misses:ratio_rate1h / {SLO_BUDGET}", "1h"),
                    q(f"modgate:request_slo_misses:ratio_rate6h / {SLO_BUDGET}", "6h"),
                ),
            ),
        ),
    ),
    (
        "Queue and slots",
        (
            PanelSpec(
                "Engine slots",
                "Calls at each engine from the selected replicas, and each engine's cap.",
                "short",
                (
                    q(f"sum by (engine) (modgate_engine_slot_inflight{{{SEL}}})", "in flight {{engine}}"),
                    q(f"max by (engine) (modgate_engine_slot_cap{{{SEL}}})", "cap {{engine}}"),
                ),
            ),
            PanelSpec(
                "Admission queue",
                "Requests waiting for a slot, and the size past which 429 answers.",
                "short",
                (
                    q(f"sum by (instance) (modgate_engine_queued{{{SEL}}})", "queued {{instance}}"),
                    q(f"max(modgate_engine_queue_size{{{SEL}}})", "queue size"),
                ),
            ),
            PanelSpec(
                "Engine circuits and failovers",
                "1 while an engine's circuit lets calls through; calls moved to another engine a second.",
                "short",
                (
                    q(f"min by (engine) (modgate_engine_up{{{SEL}}})", "up {{engine}}"),
                    q(_rate("modgate_engine_failovers_total", "engine"), "failovers/s {{engine}}"),
                ),
            ),
        ),
    ),
    (
        "Thinking and escalations",
        (
            PanelSpec(
                "Thinking share",
                "Engine-judged keyframes with thinking on (recent window); the policy's "
                "default; the load rule shedding thinking.",
                "percentunit",
                (
                    q(f"avg(modgate_window_thinking_share{{{SEL}}})", "thinking on"),
                    q(f"max by (mode) (modgate_thinking_default_mode{{{SEL}}})", "default {{mode}}"),
                    q(f"max(modgate_thinking_load_shedding{{{SEL}}})", "load rule shedding"),
                ),
                max_value=1,
            ),
            PanelSpec(
                "Keyframes by thinking mode",
                "Keyframes a second by thinking mode (reused: from the verdict cache).",
                "short",
                (q(_rate("modgate_tenant_frames_total", "thinking"), "{{thinking}}"),),
            ),
            PanelSpec(
                "Escalations",
                "Fast verdicts asked again with thinking on, by why; and unsure ones answered "
                "fast anyway, by why (cap_*: the cap bound).",
                "short",
                (
                    q(_rate("modgate_escalations_total", "reason"), "asked again: {{reason}}"),
                    q(_rate("modgate_escalations_skipped_total", "reason"), "answered fast: {{reason}}"),
                ),
            ),
        ),
    ),
    (
        "Cache and reuse",
        (
            PanelSpec(
                "Prefix cache",
                "Cached / prompt tokens of the gateway's own calls, and the engine's own hit "
                "ratio, both over the recent window (never since start).",
                "percentunit",
                (
                    q(f"avg(modgate_window_prompt_cached_ratio{{{SEL}}})", "gateway calls"),
                    q(f"avg(modgate_window_engine_prefix_cache_hit_ratio{{{SEL}}})", "engine"),
                ),
                max_value=1,
            ),
            PanelSpec(
                "Cached tokens per call",
                "What each engine call takes from the prefix cache, against what "
                "the block-filled prefix should give (its whole KV blocks).",
                "short",
                (
                    q(
                        f"{_rate('modgate_cached_tokens_total')} / "
                        f"{_rate('modgate_queue_wait_seconds_count')}",
                        "cached per call",
                    ),
                    q(
                        f"max by (verdict_format) (modgate_prefix_cacheable_tokens{{{SEL}}})",
                        "cacheable ({{verdict_format}})",
                    ),
                    q(f"max(modgate_engine_kv_block_size_tokens{{{SEL}}})", "KV block"),
                ),
            ),
            PanelSpec(
                "Verdicts reused",
                "Verdicts answered from the verdict cache a second, by kind.",
                "short",
                (q(_rate("modgate_reused_verdicts_total", "kind"), "{{kind}}"),),
            ),
        ),
    ),
    (
        "Errors",
        (
            PanelSpec(
                "Requests by outcome",
                "Live moderation requests a second by outcome (ok, overloaded = 429, "
                "engine_* = upstream, invalid_request … = the caller's).",
                "reqps",
                (q(_rate("modgate_requests_total", "outcome"), "{{outcome}}"),),
            ),
            PanelSpec(
                "Engine errors and unusable outputs",
                "Engine call failures by kind; outputs that were no "
                "verdict (each became review), by problem.",
                "short",
                (
                    q(_rate("modgate_engine_errors_total", "kind"), "engine: {{kind}}"),
                    q(_rate("modgate_unparsable_outputs_total", "problem"), "unparsable: {{problem}}"),
                ),
            ),
            PanelSpec(
                "Shadow pairs",
                "Shadow judgements for the quality module a second, by outcome.",
                "short",
                (q(_rate("modgate_shadow_pairs_total", "outcome"), "{{outcome}}"),),
            ),
        ),
    ),
    (
        "Tenants",
        (
            PanelSpec(
                "Keyframes a minute by tenant",
                "Keyframes answered per minute, by tenant.",
                "short",
                (q(f"60 * {_rate('modgate_tenant_frames_total', 'tenant')}", "{{tenant}}"),),
            ),
            PanelSpec(
                "End-to-end p95 by tenant",
                "Who waits: each tenant's 95th percentile.",
                "s",
                (q(_quantile(0.95, "modgate_tenant_request_seconds", "tenant, le"), "{{tenant}}"),),
            ),
            PanelSpec(
                "Slot wait p95 by tenant",
                "Each tenant's wait for an engine slot (fair share).",
                "s",
                (q(_quantile(0.95, "modgate_tenant_queue_wait_seconds", "tenant, le"), "{{tenant}}"),),
            ),
            PanelSpec(
                "Engine work share",
                "Each tenant's share of the engine work served (prompt-token "
                "equivalents), against its weight's share.",
                "percentunit",
                (
                    q(
                        f"{_rate('modgate_tenant_engine_work_total', 'tenant')} "
                        "/ ignoring (tenant) group_left "
                        f"{_rate('modgate_tenant_engine_work_total')}",
                        "{{tenant}}",
                    ),
                ),
                max_value=1,
                width=12,
            ),
            PanelSpec(
                "Quota refusals by tenant",
                "Requests refused 429 over a tenant's quota a second.",
                "reqps",
                (q(_rate("modgate_tenant_quota_refusals_total", "tenant, quota"), "{{tenant}} {{quota}}"),),
                width=12,
            ),
        ),
    ),
    (
        "Jobs and videos",
        (
            PanelSpec(
                "Jobs finished a minute",
                "Jobs finished a minute by kind (keyframes, video) and status; the failed ones by code.",
                "short",
                (
                    q(f"60 * {_rate('modgate_jobs_total', 'kind, status')}", "{{kind}} {{status}}"),
                    q(f"60 * {_rate('modgate_job_failures_total', 'kind, code')}",
                      "failed: {{kind}} {{code}}"),
                ),
                width=6,
            ),
            PanelSpec(
                "Job requests by outcome",
                "Moderation requests made for jobs a second (a video's: one per chunk of its frames), by "
                "kind and outcome: background work, kept out of the live requests' panels and objective.",
                "reqps",
                (q(_rate("modgate_job_requests_total", "kind, outcome"), "{{kind}} {{outcome}}"),),
                width=6,
            ),
            PanelSpec(
                "Video cut time and largest gap (p95)",
                "Time to cut a video (against MODGATE_VIDEOS__CUT_BUDGET_S), and each cut's largest gap "
                "between covered frames (against MODGATE_VIDEOS__MAX_GAP_S).",
                "s",
                (
                    q(_quantile(0.95, "modgate_video_cut_seconds"), "cut"),
                    q(_quantile(0.95, "modgate_video_coverage_gap_seconds"), "largest gap"),
                ),
                width=6,
            ),
            PanelSpec(
                "Video frames by stage",
                "Video frames a second: decoded, covered, sent to the engine, and covered by a judged "
                "look-alike's verdict (reused): sent against covered is what reuse saves.",
                "short",
                (q(_rate("modgate_video_frames_total", "stage"), "{{stage}}"),),
                width=6,
            ),
        ),
    ),
    (
        "Review queue",
        (
            PanelSpec(
                "Review queue depth",
                "Frames waiting for a reviewer or claimed, by tenant (gateway/review/).",
                "short",
                (q(f"max by (tenant) (modgate_review_queue_depth{{{SEL}}})", "{{tenant}}"),),
                width=6,
            ),
            PanelSpec(
                "Oldest review item",
                "Age of each tenant's oldest item, against the alert's threshold "
                "(MODGATE_REVIEW__OLDEST_ALERT_S).",
                "s",
                (
                    q(f"max by (tenant) (modgate_review_oldest_age_seconds{{{SEL}}})", "{{tenant}}"),
                    q(f"max (modgate_review_oldest_alert_seconds{{{SEL}}})", "alert threshold"),
                ),
                width=6,
            ),
            PanelSpec(
                "Labels an hour",
                "Labels given by reviewers an hour, by tenant.",
                "short",
                (q(f"3600 * {_rate('modgate_review_labels_total', 'tenant')}", "{{tenant}}"),),
                width=6,
            ),
            PanelSpec(
                "Disagreement rate",
                "Share of labels that differ from the model's verdict (action, or categories of a block), "
                "over the last hour.",
                "percentunit",
                (
                    q(
                        f'sum(rate(modgate_review_labels_total{{{SEL}, agrees="false"}}[1h])) '
                        f"/ sum(rate(modgate_review_labels_total{{{SEL}}}[1h]))",
                        "disagreement",
                    ),
                ),
                max_value=1,
                width=6,
            ),
        ),
    ),
)


