"""Rules on what a gateway service and the engine it calls must agree on: priorities and in-flight bounds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from deploy.check.compose import Deployment
from deploy.check.model import DEFAULT_MAX_INFLIGHT, EnvEntry, Finding, Service, gateway_setting, where

_SCHEDULING_POLICIES = ("fcfs", "priority")
# The gateway setting that makes it send priorities (gateway/settings/engine.py EngineSettings.use_priority).
USE_PRIORITY_VARIABLE = "MODGATE_ENGINE__USE_PRIORITY"


def scheduling_policy(deployment: Deployment) -> Iterator[Finding]:
    """scheduling-policy: priority scheduling where a gateway sends priorities; values vLLM accepts."""
    unreadable: list[Finding] = []
    senders = _priority_senders(deployment, unreadable)
    yield from unreadable
    for engine in deployment.engines:
        yield from _engine_policy(engine, senders.get(engine.name, []))


def _priority_senders(deployment: Deployment, unreadable: list[Finding]) -> dict[str, list[EnvEntry]]:
    """By engine name: where the gateways that send it priorities turn MODGATE_ENGINE__USE_PRIORITY on.

    A value the gateway cannot read as a boolean (it would refuse to start) goes to `unreadable`.
    """
    engines = deployment.engines
    senders: dict[str, list[EnvEntry]] = {}
    for gateway in deployment.gateways:
        entry = _setting(gateway, USE_PRIORITY_VARIABLE)
        if entry is None or entry.value is None:  # unset: the default, off
            continue
        try:
            on = TypeAdapter(bool).validate_python(entry.value)  # as pydantic-settings reads it
        except ValidationError:
            unreadable.append(
                Finding(
                    "error",
                    "scheduling-policy",
                    f"{USE_PRIORITY_VARIABLE} {entry.value!r} of `{gateway.name}` is not a boolean (true or "
                    "false): the gateway refuses to start",
                    entry.location,
                )
            )
            continue
        if on:
            for engine in _engines_for(gateway, engines):
                senders.setdefault(engine.name, []).append(entry)
    return senders


def _engine_policy(engine: Service, priority_senders: Sequence[EnvEntry]) -> Iterator[Finding]:
    """Priority scheduling is required only where a gateway sends priorities (use_priority on)."""
    flag = engine.last_flag("--scheduling-policy")
    if flag is not None and flag.value not in _SCHEDULING_POLICIES:
        yield Finding(
            "error",
            "scheduling-policy",
            f"--scheduling-policy {flag.value!r}: vLLM accepts only {' or '.join(_SCHEDULING_POLICIES)}",
            flag.arg.location,
        )
        return
    if not priority_senders or (flag is not None and flag.value == "priority"):
        return
    at = flag.arg.location if flag is not None else (engine.command_location or engine.location)
    shown = ", ".join(where(sender.location, at) for sender in priority_senders)
    policy = "--scheduling-policy fcfs" if flag else "no --scheduling-policy (vLLM's default fcfs)"
    yield Finding(
        "error",
        "scheduling-policy",
        f"{policy} rejects every request whose priority is not 0, and the gateway sends priorities "
        f"({USE_PRIORITY_VARIABLE} is on at {shown}): add --scheduling-policy priority, or turn "
        "use_priority off",
        at,
        tuple(sender.location for sender in priority_senders),
    )


def max_inflight(deployment: Deployment) -> Iterator[Finding]:
    """max-inflight: the gateway's MODGATE_ENGINE__MAX_INFLIGHT above its engine's --max-num-seqs."""
    engines = deployment.engines
    for gateway in deployment.gateways:
        engine = _engine_for(gateway, engines)
        if engine is None:
            continue
        seqs_flag = engine.last_flag("--max-num-seqs")
        if seqs_flag is None or seqs_flag.value is None:
            continue  # vLLM's default (256 or more) is above any sane gateway bound
        entry = gateway_setting(gateway.environment, "MODGATE_ENGINE__MAX_INFLIGHT")
        raw = entry.value if entry is not None and entry.value else str(DEFAULT_MAX_INFLIGHT)
        at = entry.location if entry is not None else gateway.location
        try:
            inflight, max_num_seqs = int(raw), int(seqs_flag.value)
        except ValueError:
            yield Finding(
                "error",
                "max-inflight",
                f"cannot compare MODGATE_ENGINE__MAX_INFLIGHT {raw!r} with --max-num-seqs "
                f"{seqs_flag.value!r}: both must be whole numbers",
                at,
            )
            continue
        if inflight > max_num_seqs:
            seqs_at = seqs_flag.value_arg.location if seqs_flag.value_arg else seqs_flag.arg.location
            default = "" if entry is not None else f" (the default, {DEFAULT_MAX_INFLIGHT})"
            yield Finding(
                "error",
                "max-inflight",
                f"MODGATE_ENGINE__MAX_INFLIGHT {inflight}{default} of `{gateway.name}` is above "
                f"--max-num-seqs {max_num_seqs} of `{engine.name}` (at {where(seqs_at, at)}): the excess "
                "queues inside the engine, outside the gateway's priority queue and deadlines",
                at,
                (seqs_at,),
            )


def _engine_for(gateway: Service, engines: list[Service]) -> Service | None:
    """The engine service the gateway's MODGATE_ENGINE__URL names, or the only engine there is."""
    entry = gateway_setting(gateway.environment, "MODGATE_ENGINE__URL")
    host = urlsplit(entry.value).hostname if entry is not None and entry.value else None
    named = next((engine for engine in engines if engine.name == host), None)
    if named is not None:
        return named
    return engines[0] if len(engines) == 1 else None


def _engines_for(gateway: Service, engines: list[Service]) -> list[Service]:
    """Every engine service the gateway's MODGATE_ENGINE__URL names (a comma-separated list); when it names
    none of them, the only engine there is, or every engine (which one is meant cannot be told)."""
    entry = gateway_setting(gateway.environment, "MODGATE_ENGINE__URL")
    urls = entry.value.split(",") if entry is not None and entry.value else []
    hosts = {urlsplit(url.strip()).hostname for url in urls}
    named = [engine for engine in engines if engine.name in hosts]
    return named or list(engines)


def _setting(service: Service, name: str) -> EnvEntry | None:
    """A MODGATE_* variable as pydantic-settings reads it: its name in any case, the last one winning."""
    found = [entry for key, entry in service.environment.items() if key.upper() == name]
    return found[-1] if found else None


def queue_backstop(deployment: Deployment) -> Iterator[Finding]:
    """queue-backstop: a vLLM engine a gateway calls lacks ``--max-num-queued-reqs`` above the gateway's cap.

    While Redis answers, the gateways' shared cap keeps the engine at MODGATE_ENGINE__MAX_INFLIGHT; when it is
    away each replica caps alone, so N replicas may send N times the cap, and vLLM queues all of it,
    unbounded, past every caller's deadline. ``--max-num-queued-reqs`` bounds that queue: past it vLLM answers
    503 "engine busy", which the gateway treats as back-pressure (the frame waits in its queue or moves to
    another engine; the circuit is untouched). Set above the cap, it never binds while the cap holds.
    """
    engines = deployment.engines
    for gateway in deployment.gateways:
        entry = gateway_setting(gateway.environment, "MODGATE_ENGINE__MAX_INFLIGHT")
        raw = entry.value if entry is not None and entry.value else str(DEFAULT_MAX_INFLIGHT)
        try:
            cap = int(raw)
        except ValueError:
            continue  # max-inflight reports it
        for engine in _engines_for(gateway, engines):
            if engine.engine_kind != "vllm":
                continue  # llama-server holds a request until a slot frees; its slots are the gateway's cap
            recommended = 2 * cap
            flag = engine.last_flag("--max-num-queued-reqs")
            why = (
                f"with Redis away each gateway replica caps `{engine.name}` alone at {cap}, so several "
                "replicas may send it several times that, and vLLM queues the excess without bound past "
                "every caller's deadline; past --max-num-queued-reqs it answers 503 'engine busy', which "
                "the gateway treats as back-pressure (the frame waits in its queue or moves to another "
                "engine, the circuit untouched)"
            )
            if flag is None or flag.value is None:
                yield Finding(
                    "warning",
                    "queue-backstop",
                    f"`{engine.name}` has no --max-num-queued-reqs: add `--max-num-queued-reqs "
                    f"{recommended}` (above MODGATE_ENGINE__MAX_INFLIGHT {cap}, so it never binds while the "
                    f"shared cap holds): {why}",
                    engine.command_location or engine.location,
                )
                continue
            try:
                queued = int(flag.value)
            except ValueError:
                continue  # vLLM itself refuses it at start
            if queued <= cap:
                at = flag.value_arg.location if flag.value_arg else flag.arg.location
                yield Finding(
                    "warning",
                    "queue-backstop",
                    f"--max-num-queued-reqs {queued} of `{engine.name}` is not above "
                    f"MODGATE_ENGINE__MAX_INFLIGHT {cap} of `{gateway.name}`: the engine answers busy within "
                    "the gateway's own cap, and every such answer is a retry; set it to about "
                    f"{recommended}, a backstop for when Redis is away",
                    at,
                    (entry.location,) if entry is not None else (),
                )
