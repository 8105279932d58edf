"""What the gateway needs from each engine, checked once at start, each missing piece said once with its fix.

An engine started without a flag the gateway relies on does not fail: it answers, and a figure silently
goes missing (vLLM without ``--enable-prompt-tokens-details`` gives no per-request cached tokens, without
``--reasoning-parser`` no reasoning split, with ``--max-logprobs`` below what is asked no confidence). So
the gateway asks each engine two small chat completions (thinking off under the verdict's kind of
constraint with log-probabilities, and thinking on), reads ``/v1/models`` and ``/metrics``, and says what
it found: in the log (once per finding), in ``/readyz`` (``engine_checks``), in the metric
``modgate_engine_check{check,engine}`` (1 present, 0 missing) and in the console. The gateway keeps
serving whatever the findings; each says what it cannot do until the engine is restarted with the fix.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from gateway.engine.client import EngineClient
from gateway.engine.engine_slot import EngineHold, unheld
from gateway.engine.first_request import FirstRequestProbe
from gateway.engine.wires import StartupHints, read_cache_config
from gateway.errors import ModgateError
from gateway.tasks import stop

log = logging.getLogger("modgate.engine")

CheckName = Literal[
    "served_model", "structured_outputs", "logprobs", "cached_tokens", "reasoning_split", "prefix_caching",
    "max_num_seqs",
]
CHECKS: Final[tuple[CheckName, ...]] = (
    "served_model", "structured_outputs", "logprobs", "cached_tokens", "reasoning_split", "prefix_caching",
    "max_num_seqs",
)
PROBE_REGEX: Final = "(allow|review|block)"
"""The probe's constraint: the verdict's first word, which every verdict format starts from."""
PROBE_TOKENS: Final = 16  # enough for a word or the start of a thought; the probe costs the engine little


@dataclass(frozen=True, slots=True)
class EngineCheck:
    """One finding about one engine: ``ok`` None when the engine does not say (nothing to fix here)."""

    check: CheckName
    engine: str
    ok: bool | None
    detail: str  # what was seen
    fix: str = ""  # the engine flag (or setting) that fixes it
    meanwhile: str = ""  # what the gateway cannot do until then

    def as_dict(self) -> dict[str, Any]:
        """The finding as ``/readyz`` and the console show it."""
        return asdict(self)

    def message(self) -> str:
        """The log line for a missing piece: what, the fix, what is lost meanwhile."""
        return (f"engine {self.engine}: {self.check} missing ({self.detail}); fix: {self.fix}; "
                f"until then {self.meanwhile}")


@dataclass(frozen=True, slots=True)
class CheckTargets:
    """What the gateway asks of the engines: its model setting, its cap per engine, its logprobs."""

    model: str  # "auto": the first model the engine lists
    top_logprobs: int  # alternatives per token the confidence needs (0: confidence switched off)


async def check_engine(client: EngineClient, cap: int, targets: CheckTargets) -> list[EngineCheck]:
    """Every check against one engine; raises ``ModgateError`` when the engine does not answer at all."""
    url = client.base_url
    wire = await client.wire()
    hints = wire.hints
    found: list[EngineCheck] = []

    served = await client.model_ids()
    model = served[0] if served and targets.model == "auto" else targets.model
    if not served:
        found.append(EngineCheck("served_model", url, False, "/v1/models lists no model",
                                 "start the engine with the model", "no verdict can be asked"))
        return found
    if model not in served:
        flag = hints.served_name_flag
        found.append(EngineCheck(
            "served_model", url, False, f"MODGATE_ENGINE__MODEL is {model!r}, the engine serves {served}",
            f"{flag} {model} (or MODGATE_ENGINE__MODEL={served[0]})", "every verdict request is refused",
        ))
        model = served[0]
    else:
        found.append(EngineCheck("served_model", url, True, f"serves {model}"))

    fast = {
        "model": model,
        "messages": [{"role": "user", "content": "Answer allow, review or block."}],
        "max_completion_tokens": PROBE_TOKENS,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"regex": PROBE_REGEX},
    }
    logprobs_check: EngineCheck | None = None
    if targets.top_logprobs > 0:
        asked = {**fast, "logprobs": True, "top_logprobs": targets.top_logprobs}
        status, answer = await client.probe_chat(asked)
        if status == 400 and "logprob" in _error_text(answer).lower():
            logprobs_check = EngineCheck(
                "logprobs", url, False,
                f"refused top_logprobs {targets.top_logprobs}: {_error_text(answer)}",
                f"--max-logprobs {targets.top_logprobs}",
                "verdicts carry no confidence, so escalate re-asks every frame with thinking on",
            )
            status, answer = await client.probe_chat(fast)
    else:
        status, answer = await client.probe_chat(fast)
        logprobs_check = EngineCheck("logprobs", url, None, "not asked (MODGATE_ENGINE__TOP_LOGPROBS is 0)")
    if status != 200:
        raise _ProbeFailed(f"the probe answered {status}: {_error_text(answer)}")
    choice = _first_choice(answer)
    content = str(choice.get("message", {}).get("content") or "")
    if re.fullmatch(PROBE_REGEX, content.strip()):
        found.append(EngineCheck("structured_outputs", url, True, f"answered {content!r}"))
    else:
        found.append(EngineCheck(
            "structured_outputs", url, False, f"a constrained answer came back as {content[:60]!r}",
            hints.grammar_fix,
            "verdicts outside the format read as review",
        ))
    if logprobs_check is None:
        logprobs_check = _logprobs_check(url, choice, targets.top_logprobs, hints)
    found.append(logprobs_check)
    found.append(_cached_tokens_check(url, answer, hints))

    # The gateway's own thinking-on request: the verdict's constraint (after the thought), streamed.
    status, chunks = await client.probe_stream({**fast, "chat_template_kwargs": {"enable_thinking": True}})
    if status != 200:
        raise _ProbeFailed(f"the thinking probe answered {status}")
    found.append(_reasoning_check(url, chunks, hints))

    found.append(await _prefix_caching_check(client, hints))
    found.append(_max_num_seqs_check(client, cap, hints))
    return found


class _ProbeFailed(ModgateError):
    """The engine answered the probe with an error the checks cannot read."""


def _first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}


def _error_text(answer: dict[str, Any]) -> str:
    error = answer.get("error")
    if isinstance(error, dict):
        return str(error.get("message", ""))
    return str(error or answer.get("detail") or "")


def _reasoning_check(url: str, chunks: list[dict[str, Any]], hints: StartupHints) -> EngineCheck:
    reasoning = content = ""
    for chunk in chunks:
        delta = _first_choice(chunk).get("delta") or {}
        reasoning += str(delta.get("reasoning") or delta.get("reasoning_content") or "")
        content += str(delta.get("content") or "")
    if reasoning:
        return EngineCheck("reasoning_split", url, True, "the thought comes back apart")
    if not content.strip():  # a model that wrote nothing readable (the tiny test models' blanks)
        return EngineCheck("reasoning_split", url, None, "the thinking-on answer held no text to judge")
    return EngineCheck(
        "reasoning_split", url, False, "a thinking-on answer came back with no reasoning field",
        hints.reasoning_fix,
        "thinking-on verdicts are read from text that still holds the thought (more read as review)",
    )


def _logprobs_check(url: str, choice: dict[str, Any], wanted: int, hints: StartupHints) -> EngineCheck:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return EngineCheck(
            "logprobs", url, False, "an answer asked with logprobs came back without them",
            hints.logprobs_fix.format(wanted=wanted),
            "verdicts carry no confidence, so escalate re-asks every frame with thinking on",
        )
    alternatives = len(content[0].get("top_logprobs") or [])
    if alternatives < wanted:
        return EngineCheck(
            "logprobs", url, False, f"{alternatives} alternatives per token, {wanted} asked",
            hints.logprobs_short_fix.format(wanted=wanted),
            "confidence counts fewer alternatives and reads lower, so escalate re-asks more frames",
        )
    return EngineCheck("logprobs", url, True, f"{alternatives} alternatives per token")


def _cached_tokens_check(url: str, answer: dict[str, Any], hints: StartupHints) -> EngineCheck:
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and "cached_tokens" in details:
        return EngineCheck("cached_tokens", url, True, "usage.prompt_tokens_details.cached_tokens is there")
    return EngineCheck(
        "cached_tokens", url, False, "usage.prompt_tokens_details is missing",
        hints.cached_tokens_fix,
        "per-request cached tokens read 0; the prefix-cache rate comes from the engine's /metrics alone",
    )


async def _prefix_caching_check(client: EngineClient, hints: StartupHints) -> EngineCheck:
    url = client.base_url
    if hints.prefix_cache_kept:  # llama-server keeps each slot's prompt unless a request says otherwise
        return EngineCheck("prefix_caching", url, True, hints.prefix_cache_kept)
    try:
        text = await client.metrics_text()
    except ModgateError as exc:
        return EngineCheck("prefix_caching", url, None, f"/metrics unreadable: {exc.message}")
    config = read_cache_config(text)
    if config is None or config.enable_prefix_caching is None:
        return EngineCheck("prefix_caching", url, None, "/metrics has no vllm:cache_config_info")
    if config.enable_prefix_caching:
        return EngineCheck("prefix_caching", url, True, "enable_prefix_caching True")
    return EngineCheck(
        "prefix_caching", url, False, "enable_prefix_caching False",
        "--enable-prefix-caching", "the shared system prompt is prefilled again every frame",
    )


def _max_num_seqs_check(client: EngineClient, cap: int, hints: StartupHints) -> EngineCheck:
    url = client.base_url
    if hints.publishes_slots:
        if client.slots is None:
            return EngineCheck("max_num_seqs", url, None, "/props names no slots")
        if client.slots < cap:
            return EngineCheck(
                "max_num_seqs", url, False, f"--parallel {client.slots} slots, the gateway's cap is {cap}",
                f"--parallel {cap} (or MODGATE_ENGINE__MAX_INFLIGHT={client.slots})",
                "calls past the slots wait inside the engine, outside the gateway's priorities and deadlines",
            )
        return EngineCheck("max_num_seqs", url, True, f"--parallel {client.slots} slots for a cap of {cap}")
    return EngineCheck(
        "max_num_seqs", url, None,
        f"vLLM does not publish --max-num-seqs; keep it at least {cap} (modgate deploy check compares them)",
    )


class EngineChecks:
    """The start-up checks of every engine, run in the background until each engine has answered once."""

    def __init__(
        self,
        engines: Sequence[tuple[EngineClient, int]],
        targets: CheckTargets,
        record: Callable[[EngineCheck], None] = lambda _check: None,
        retry_s: float = 5.0,
        hold: EngineHold = unheld,
        first_request: FirstRequestProbe | None = None,
    ) -> None:
        self._engines = list(engines)
        # An engine is checked once it passed its first request: one that fails it (a hybrid model in
        # float32) exits after that 500, and the probe, not a check's, is what says why.
        self._first_request = first_request
        self._hold = hold  # one slot of the engine's cap for its probes, sent one after the other
        self._targets = targets
        self._record = record
        self._retry_s = retry_s
        self.results: dict[str, list[EngineCheck]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Check in the background: start-up does not wait on an engine that is still loading."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="engine-startup-check")

    async def run(self) -> None:
        """Check every engine once it answers; each finding is logged once."""
        await asyncio.gather(*(self._check_until_answered(client, cap) for client, cap in self._engines))

    async def _check_until_answered(self, client: EngineClient, cap: int) -> None:
        while True:
            if self._first_request is not None:
                passed = await self._first_request.check(client, await client.healthy())
                if passed is None or passed.status == "failed":
                    await asyncio.sleep(self._retry_s)
                    continue
            try:
                async with self._hold(client.base_url):
                    found = await check_engine(client, cap, self._targets)
            except ModgateError as exc:
                log.debug("engine %s not checked yet (%s): again in %g s", client.base_url, exc.message,
                          self._retry_s)
                await asyncio.sleep(self._retry_s)
                continue
            self.results[client.base_url] = found
            for check in found:
                self._record(check)
                if check.ok is False:
                    log.warning("%s", check.message())
            fine = [check.check for check in found if check.ok]
            log.info("engine %s checked: %s present", client.base_url, ", ".join(fine) or "nothing")
            return

    def findings(self) -> list[dict[str, Any]]:
        """Every engine's findings, as ``/readyz`` shows them (empty until an engine answered)."""
        return [check.as_dict() for found in self.results.values() for check in found]

    async def aclose(self) -> None:
        """Stop checking (an engine that never answered stays unchecked)."""
        await stop(self._task)
