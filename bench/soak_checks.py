"""What the soak saw, and the invariants it checks at the end (``bench.soak``).

Each invariant is a row: what it says, how many things it was checked on (0 means it was not exercised, and
then it does not hold), how many broke it, and whether it holds. Values in, values out: no processes here.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from contracts.decisions import DecisionRow
from quality.labels import reviewer_agreement

DOCUMENTED_CLIENT_ERRORS = frozenset({400, 413, 415, 422})  # bad input (docs/api.md)
SHARE_TOLERANCE = 0.1  # a tenant's share of the contested slots may stray this far from its weight's


@dataclass
class Answer:
    """One HTTP exchange with the gateways (through HAProxy), as the caller saw it."""

    at: float  # seconds into the soak, when it was sent
    what: str  # "live", "bad-input", "job", "flip", "review"
    tenant: str
    status: int  # 0: no answer (a transport error)
    latency_s: float
    code: str = ""  # the error's code, or the transport error's name
    openai_shape: bool = True
    retry_after: bool = False
    request_id: str = ""  # a live answer's id (``modr-…``)
    actions: tuple[str, ...] = ()  # a live answer's verdicts
    engine_requests: tuple[str, ...] = ()  # and each one's ``modgate.request_id``
    reused: tuple[bool, ...] = ()  # and whether it was another call's verdict (offered for review with it)
    # each verdict the engine judged in one call: (when it began waiting for a slot, when it got one), in
    # seconds into the soak, from the answer's shaping_ms and queue_ms (the wait: the replica's queue and
    # the lease across replicas)
    waits: tuple[tuple[float, float], ...] = ()


@dataclass
class Window:
    """A fault, as it ran: when it began and ended (seconds into the soak), and how it went."""

    kind: str
    start: float
    end: float
    target: str = ""
    note: str = ""


@dataclass
class Observations:
    """Everything the soak records while it runs, and what it reads at the end."""

    answers: list[Answer] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    local_caps: list[Window] = field(default_factory=list)  # a replica on its local shares (Redis too slow)
    jobs: dict[str, str] = field(default_factory=dict)  # job id -> tenant, every submission answered 202
    video_jobs: set[str] = field(default_factory=set)  # those of them that sent a video (cut by the gateway)
    job_states: dict[str, tuple[str, int]] = field(default_factory=dict)  # job id -> (status, completions)
    deliveries: Counter[str] = field(default_factory=Counter)  # X-Modgate-Delivery -> deliveries
    bad_signatures: int = 0
    claimed: dict[str, str] = field(default_factory=dict)  # review item id -> its request id
    labelled: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    still_queued: set[str] = field(default_factory=set)  # item ids in the queue at the end
    still_queued_decisions: set[str] = field(default_factory=set)  # the decision ids of those items
    job_decisions: dict[str, list[str]] = field(default_factory=dict)  # job -> its frames' decision_id
    queued_request_ids: set[str] = field(default_factory=set)  # request ids of every item seen queued
    decision_rows: list[dict[str, Any]] = field(default_factory=list)
    engine_peaks: list[tuple[float, str, int]] = field(default_factory=list)  # (at, engine, peak since last)
    caps: dict[str, int] = field(default_factory=dict)
    # engine name -> purpose -> calls the gateways counted ``ok`` (every replica's runs), and the engine's own
    # count of chat completions it answered whole (every run of it)
    engine_ok: dict[str, Counter[str]] = field(default_factory=dict)
    engine_whole: dict[str, int] = field(default_factory=dict)
    replicas: int = 2
    policy_versions: list[int | None] = field(default_factory=list)  # each replica's, at the end
    model_swaps_seen: list[bool] = field(default_factory=list)
    deadline_s: float = 0.0
    settle_s: float = 3.0  # after a fault ends, still counted as its window (circuits, HAProxy's checks)
    redis_settle_s: float = 12.0  # after a Redis fault: local caps, and the calls admitted on them


def rows_from_stream(entries: list[tuple[Any, dict[Any, Any]]]) -> list[dict[str, Any]]:
    """Decision-log rows from ``XRANGE`` entries (each ``{"row": <JSON>}``)."""
    rows = []
    for _, fields in entries:
        value = fields.get(b"row", fields.get("row"))
        if value is not None:
            rows.append(json.loads(value))
    return rows


def result_decisions(result: str) -> list[str]:
    """The ``decision_id`` of each frame of a job's result (its JSON document)."""
    return [frame["modgate"]["decision_id"] for frame in json.loads(result)["frames"]]


REDIS_FAULTS = ("redis_primary_kill", "redis_stall")


def in_window(at: float, seen: Observations, kinds: tuple[str, ...] = (), before_s: float = 0.0) -> bool:
    """Whether ``at`` falls in a fault's window (from ``before_s`` ahead of it) or its settling after; only
    ``kinds`` if given."""
    windows = seen.windows
    return any(w.start - before_s <= at <= w.end + (seen.redis_settle_s if w.kind in REDIS_FAULTS
                                                     else seen.settle_s)
               for w in windows if not kinds or w.kind in kinds)


def documented(answer: Answer) -> bool:
    """An error answer the API documents: OpenAI's shape, 429/503 with Retry-After, 502/504, or a 4xx for
    bad input (docs/api.md); never a 500, never another 4xx for good input."""
    if not answer.openai_shape:
        return False
    if answer.status in (429, 503):
        return answer.retry_after
    if answer.status in (502, 504):
        return True
    if answer.what == "bad-input":
        return answer.status in DOCUMENTED_CLIENT_ERRORS
    if answer.what == "review":  # another reviewer holds or labelled it (docs/review.md)
        return answer.status in (404, 409)
    return answer.what == "flip" and answer.status == 409  # a flip raced by another: a stale version


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p95, p99 (None for none)."""
    if len(values) < 2:
        return {"n": len(values), "p50": values[0] if values else None, "p95": None, "p99": None}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"n": len(values), "p50": round(cuts[49], 3), "p95": round(cuts[94], 3), "p99": round(cuts[98], 3)}


def row(invariant: str, count: int, broken: int, detail: str = "") -> dict[str, Any]:
    """One line of the table: checked on ``count`` things, ``broken`` of them broke it."""
    return {"invariant": invariant, "count": count, "broken": broken, "holds": count > 0 and broken == 0,
            "detail": detail}


def check(seen: Observations) -> list[dict[str, Any]]:
    """Every invariant, in the table's order."""
    return [_jobs_once(seen), _webhooks(seen), _deadlines(seen), _answered(seen), _errors(seen),
            _decisions(seen), job_decision_rows(seen), review_items(seen), _review_verdicts_queued(seen),
            reviewer_kappa(seen), *engine_caps(seen), *engine_outcomes(seen), _policy(seen),
            _model_swap(seen), _fair_share(seen)]


def _jobs_once(seen: Observations) -> dict[str, Any]:
    states = [seen.job_states.get(job, ("missing", 0)) for job in seen.jobs]
    broken = [s for s in states if s[0] not in ("succeeded", "failed") or s[1] != 1]
    ends = Counter(f"{status} x{completions}" for status, completions in states)
    videos = Counter(seen.job_states.get(job, ("missing", 0))[0] for job in seen.video_jobs)
    of_videos = ", ".join(f"{n} {status}" for status, n in videos.items())
    return row("every accepted job finished exactly once", len(states), len(broken),
               ", ".join(f"{n} {end}" for end, n in ends.most_common())
               + f"; {len(seen.video_jobs)} of them videos ({of_videos})")


def _webhooks(seen: Observations) -> dict[str, Any]:
    missing = [job for job in seen.jobs if seen.deliveries.get(job, 0) < 1]
    repeats = sum(n - 1 for job, n in seen.deliveries.items() if job in seen.jobs)
    return row("every accepted job's webhook delivered at least once", len(seen.jobs), len(missing),
               f"{repeats} repeated deliveries (deduplicated), {seen.bad_signatures} bad signatures")


def _live(seen: Observations) -> list[Answer]:
    return [a for a in seen.answers if a.what in ("live", "bad-input")]


def _deadlines(seen: Observations) -> dict[str, Any]:
    live = _live(seen)
    late = [a for a in live if a.latency_s > seen.deadline_s]
    slowest = max((a.latency_s for a in live), default=0.0)
    return row(f"no live call hung past its deadline ({seen.deadline_s:g} s)", len(live), len(late),
               f"slowest {slowest:.2f} s")


def _answered(seen: Observations) -> dict[str, Any]:
    live = _live(seen)
    dropped = [a for a in live if a.status == 0]
    kinds = Counter(a.code for a in dropped)
    return row("every live call got an answer (no dropped connection)", len(live), len(dropped),
               ", ".join(f"{n} {code}" for code, n in kinds.items())
               + (f" at {sorted(round(a.at) for a in dropped)} s" if dropped else ""))


def _errors(seen: Observations) -> dict[str, Any]:
    errors = [a for a in seen.answers if a.status >= 400]
    wrong = Counter(f"{a.what} {a.status} {a.code}" for a in errors if not documented(a))
    wrong.update(f"{a.what} {a.status} accepted" for a in seen.answers
                 if a.what == "bad-input" and 0 < a.status < 400)
    kinds = Counter(f"{a.status} {a.code}" for a in errors)
    detail = "bad: " + ", ".join(f"{n} {k}" for k, n in wrong.items()) if wrong else ", ".join(
        f"{n} {k}" for k, n in kinds.most_common(6))
    return row("every error answer is documented (429/503 with Retry-After, no 500)", len(errors),
               sum(wrong.values()), detail)


def _decisions(seen: Observations) -> dict[str, Any]:
    logged = Counter(r["request_id"] for r in seen.decision_rows if r.get("kind") != "label")
    answered = [a for a in seen.answers if a.what == "live" and a.status == 200]
    lost = sum(max(0, len(a.actions) - logged.get(a.request_id, 0)) for a in answered)
    doubled = sum(max(0, logged.get(a.request_id, 0) - len(a.actions)) for a in answered)
    verdicts = sum(len(a.actions) for a in answered)
    return row("every verdict answered is one row in the decision log", verdicts, lost + doubled,
               f"{lost} lost, {doubled} doubled; {len(seen.decision_rows)} rows in all")


def job_decision_rows(seen: Observations) -> dict[str, Any]:
    """Each frame a succeeded job judged is one row of the decision log (by its ``decision_id``), and no
    decision is logged twice anywhere, a retried job's earlier attempts included."""
    rows = Counter(r.get("decision_id") for r in seen.decision_rows if r.get("kind") != "label")
    frames = [decision for decisions in seen.job_decisions.values() for decision in decisions]
    lost = sum(rows.get(decision, 0) == 0 for decision in frames)
    doubled = sum(n - 1 for decision, n in rows.items() if decision is not None and n > 1)
    kept = set(frames)
    earlier = sum(n for decision, n in rows.items() if decision not in kept) if frames else 0
    return row("every frame a job judged is one row in the decision log (retries included)", len(frames),
               lost + doubled, f"{len(seen.job_decisions)} jobs; {lost} lost, {doubled} doubled anywhere; "
               f"{earlier} rows of live calls and earlier attempts")


def review_items(seen: Observations) -> dict[str, Any]:
    """Every decision queued for review (its row's ``review_reason``: the item went into the queue) is
    labelled or still queued at the end, and so is every item a reviewer claimed."""
    queued = {r["decision_id"] for r in seen.decision_rows
              if r.get("kind") != "label" and r.get("review_reason") and r.get("decision_id")}
    labelled = {r.get("decision_id") for r in seen.decision_rows if r.get("kind") == "label"}
    lost = queued - labelled - seen.still_queued_decisions
    claimed_lost = [i for i in seen.claimed if i not in seen.labelled and i not in seen.still_queued]
    return row("every decision queued for review is labelled or still queued",
               len(queued) + len(seen.claimed), len(lost) + len(claimed_lost),
               f"{len(queued)} queued, {len(queued & labelled)} labelled, {len(lost)} lost; "
               f"{len(seen.claimed)} items claimed ({len(seen.skipped)} skipped), {len(claimed_lost)} lost")


def reviewer_kappa(seen: Observations) -> dict[str, Any]:
    """Two people labelled the same decisions (the audit sample's twins): Cohen's kappa and its pairs."""
    rows = [DecisionRow.model_validate(r) for r in seen.decision_rows]
    reviewers = Counter(r.labelled_by for r in rows if r.kind == "label")
    agreement = reviewer_agreement(rows)
    if agreement is None:
        return row("two reviewers labelled the same decisions (Cohen's kappa)", 0, 0,
                   f"no decision labelled by two people; labels by {dict(reviewers)}")
    return row("two reviewers labelled the same decisions (Cohen's kappa)", agreement.frames, 0,
               f"kappa {agreement.kappa:.2f} [{agreement.low:.2f}, {agreement.high:.2f}] on "
               f"{agreement.frames} pairs, observed agreement {agreement.observed:.2f}; labels by "
               f"{dict(reviewers)}")


def _review_verdicts_queued(seen: Observations) -> dict[str, Any]:
    # Redis replicates asynchronously: what a killed primary took in its last moment would be lost with it,
    # but the soak's gateways answer a review verdict once a replica holds its item
    # (MODGATE_REVIEW__WAIT_REPLICAS), so only the fault windows themselves are left out. An item is queued
    # just before the answer goes out: the answer's time says whether Redis was there (a call sent before a
    # kill may queue its item after it, and be told so in the gateway's log).
    reviews = [a for a in seen.answers if a.what == "live" and a.status == 200 and "review" in a.actions
               and not in_window(a.at + a.latency_s, seen, REDIS_FAULTS)]
    # An item names the engine request of its frame, the result's ``modgate.request_id``.
    wanted = [request for a in reviews
              for action, request, reused in zip(a.actions, a.engine_requests, a.reused, strict=True)
              if action == "review" and not reused]
    missing = [request for request in wanted if request not in seen.queued_request_ids]
    at = sorted(round(a.at + a.latency_s, 1) for a in reviews if any(r in missing for r in a.engine_requests))
    return row("every review verdict (outside Redis faults) reached the review queue", len(wanted),
               len(missing), f"{len(missing)} never seen queued" + (f", answered at {at} s" if at else ""))


def engine_caps(seen: Observations) -> list[dict[str, Any]]:
    """Each engine never had more requests at once than its cap, at any time: no window is excused (while
    Redis is unreachable each replica serves on its share of the cap)."""
    rows = []
    spells = sum(w.end - w.start for w in seen.local_caps)
    for engine, cap in seen.caps.items():
        samples = [(at, peak) for at, name, peak in seen.engine_peaks if name == engine]
        over = [round(at) for at, peak in samples if peak > cap]
        within = [peak for at, peak in samples if in_window(at, seen, REDIS_FAULTS)]
        rows.append(row(f"{engine} never saw more in flight than its cap {cap} (Redis faults included)",
                        len(samples), len(over),
                        f"peak {max((p for _, p in samples), default=0)}, {max(within, default=0)} within "
                        f"Redis faults; {spells:.1f} s of replicas on local shares"
                        + (f"; over at {over} s" if over else "")))
    return rows


CHAT_PURPOSES = ("verdict", "probe", "check")  # the gateway's calls to /v1/chat/completions


def engine_outcomes(seen: Observations) -> list[dict[str, Any]]:
    """No engine call is ``ok`` in the gateways' metrics that the engine did not answer whole: the chat
    completions counted ``ok`` (verdicts, probes, checks) against the simulator's own count. The other way
    round is no fault: a call in flight when its replica was killed, or timed out as it ended."""
    rows = []
    for engine, whole in seen.engine_whole.items():
        purposes = seen.engine_ok.get(engine, Counter())
        ok = sum(purposes[p] for p in CHAT_PURPOSES)
        rows.append(row(f"{engine}: no chat call counted ok that the engine did not answer whole", ok,
                        max(0, ok - whole),
                        f"{ok} ok ({', '.join(f'{n} {p}' for p, n in sorted(purposes.items()))}), {whole} "
                        f"answered whole; {max(0, whole - ok)} whole answers not counted ok"))
    return rows


def _policy(seen: Observations) -> dict[str, Any]:
    versions = seen.policy_versions
    agree = len(versions) == seen.replicas and None not in versions and len(set(versions)) == 1
    flips = [a for a in seen.answers if a.what == "flip"]
    done = sum(a.status == 200 for a in flips)
    return row("both replicas end on the same policy version", len(versions), 0 if agree else 1,
               f"versions {versions}; {done} of {len(flips)} flips applied")


def _model_swap(seen: Observations) -> dict[str, Any]:
    swaps = seen.model_swaps_seen
    return row("every replica serves the swapped model's id", len(swaps), sum(not s for s in swaps))


def _fair_share(seen: Observations) -> dict[str, Any]:
    """With equal weights, a slot that both tenants wait for goes to each half the time (docs/tenants.md):
    outside the fault windows, of the slots granted while the other tenant had a call waiting, each tenant
    took half, within ``SHARE_TOLERANCE``. Slots taken while the other tenant waited for nothing are not
    the fair share's to split: how often that happens depends on how fast the machine turns a caller round,
    so the engine's verdicts overall (shown too) are not the measure."""
    waits: dict[str, list[tuple[float, float]]] = {}
    for answer in seen.answers:
        if answer.what == "live":
            waits.setdefault(answer.tenant, []).extend(w for w in answer.waits if not in_window(w[1], seen))
    contested: Counter[str] = Counter()
    for tenant, mine in waits.items():
        others = _Waits([w for other, theirs in waits.items() if other != tenant for w in theirs])
        contested[tenant] = sum(others.span(granted) for _, granted in mine)
    total = sum(contested.values())
    shares = {tenant: round(n / total, 3) for tenant, n in sorted(contested.items())} if total else {}
    # A short run has few contested slots: there the bound is two standard errors of an even share over that
    # many, when wider than the tolerance.
    bound = max(SHARE_TOLERANCE, 1 / math.sqrt(total)) if total else SHARE_TOLERANCE
    off = [t for t, s in shares.items() if abs(s - 1 / max(1, len(shares))) > bound]
    granted = Counter({tenant: len(mine) for tenant, mine in sorted(waits.items())})
    overall = {t: round(n / max(1, sum(granted.values())), 3) for t, n in granted.items()}
    return row(f"fair shares within {SHARE_TOLERANCE:g} of equal outside fault windows", total,
               len(off) if len(shares) > 1 and min(contested.values()) > 0 else 1,
               f"of {total} slots granted while the other tenant waited: {dict(sorted(contested.items()))}, "
               f"shares {shares}, bound ±{bound:.3f}; of every slot a live call took: {overall}")


CONTESTED_MARGIN_S = 0.05  # the other's wait spans the grant by this much (the 10-50 ms lease polls)


class _Waits:
    """Waits (began, granted), to ask whether one spans a moment."""

    def __init__(self, waits: list[tuple[float, float]]) -> None:
        self.waits = sorted(waits)
        self.began = [began for began, _ in self.waits]
        self.longest = max((granted - began for began, granted in waits), default=0.0)

    def span(self, at: float) -> bool:
        """Whether one began before ``at`` and was granted after it, by the margin either side."""
        for index in range(bisect.bisect_right(self.began, at - CONTESTED_MARGIN_S) - 1, -1, -1):
            began, granted = self.waits[index]
            if granted >= at + CONTESTED_MARGIN_S:
                return True
            if began < at - self.longest:  # every wait before this one ended before ``at``
                return False
        return False


def latencies(seen: Observations) -> dict[str, Any]:
    """p50/p95/p99 of answered live calls, outside and inside the fault windows."""
    live = [a for a in seen.answers if a.what == "live" and a.status != 0]
    inside = [a.latency_s for a in live if in_window(a.at, seen)]
    outside = [a.latency_s for a in live if not in_window(a.at, seen)]
    return {"outside_faults": percentiles(outside), "within_faults": percentiles(inside)}


def table_text(table: list[dict[str, Any]]) -> str:
    """The table, as text."""
    width = max(len(r["invariant"]) for r in table)
    lines = [f"{'invariant':<{width}} | {'count':>7} | holds", "-" * (width + 20)]
    for r in table:
        lines.append(f"{r['invariant']:<{width}} | {r['count']:>7} | {'yes' if r['holds'] else 'NO'}"
                     + (f"  ({r['detail']})" if r["detail"] else ""))
    return "\n".join(lines)
