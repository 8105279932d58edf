"""The engine wire's protocol and the registry of kinds (the package's docstring says what a wire is)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from shaping.confidence import TokenLogprob, probability
from shaping.prefix_strategy import EngineCacheConfig

TokenizeStep = tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]
"""One POST of a token count: its path and its body, made from the previous step's answer."""

IMAGE_TOKENS_UNCOUNTED: Final = (
    "the engine reports no image tokens (llama.cpp's usage counts the prompt as a whole)"
)
"""Why a result's (or a window's) image tokens are null: unknown, which 0 would misstate."""

EngineKind = Literal["vllm", "llamacpp"]
ENGINE_KINDS: Final[tuple[EngineKind, ...]] = ("vllm", "llamacpp")
EngineKindSetting = Literal["auto", "vllm", "llamacpp"]
DEFAULT_KIND: Final = "vllm"
"""The kind of an engine no wire claims from its ``/props`` (vLLM serves none)."""


@dataclass(frozen=True, slots=True)
class StartupHints:
    """What the start-up checks (gateway/engine/startup_check.py) tell an operator to change."""

    served_name_flag: str
    grammar_fix: str
    logprobs_fix: str  # ``{wanted}``: the alternatives the gateway asks
    logprobs_short_fix: str
    cached_tokens_fix: str
    reasoning_fix: str
    prefix_cache_kept: str | None  # the engine keeps its prompt cache without a flag (no /metrics to read)
    publishes_slots: bool  # /props names its slots (else the cap is compared by ``modgate deploy check``)


@dataclass(frozen=True, slots=True)
class CacheProbeText:
    """The cache probe's diagnosis where it depends on the engine (None: the block-based reading)."""

    counter_names: str  # its prefix-cache counters, as an operator looks for them
    no_block: str | None = None  # what stands for the KV block where the engine has none
    repeat_missed: str | None = None  # an identical request got no cached tokens
    production_missed: str | None = None  # ``{n}``: a production-shaped request got none of its n tokens


class EngineWire:
    """An OpenAI-compatible engine server: the shape the gateway builds, taken as it is.

    Each kind subclasses it and overrides what its engine does differently; the defaults are vLLM's
    OpenAI shape, which the gateway builds.
    """

    kind: ClassVar[str] = DEFAULT_KIND
    # Under a grammar vLLM returns the probabilities the grammar left (masked logits), llama.cpp does not.
    logprobs_grammar_masked: ClassVar[bool] = True
    counts_image_tokens: ClassVar[bool] = True  # usage.prompt_tokens_details.multimodal_tokens
    # Whether the stream's first chunk (the role's) comes with the first generated token: vLLM sends it
    # before any; llama-server with its first token, which may change no field (a blank of the thought).
    first_chunk_is_a_token: ClassVar[bool] = False
    busy_answers: ClassVar[tuple[str, ...]] = ()
    """This engine's 503 messages that mean "busy, come back"."""
    prefix_reuse: ClassVar[str | None] = None
    """Why this engine's prompt cache needs no block planning (it reuses token by token), or None: the
    engine caches whole KV blocks (the prefix strategy, the cache probe and ``/stats`` follow it)."""
    block_note: ClassVar[str | None] = None
    """What stands for the KV block in a display where the engine has none (``/stats``, the console)."""
    cache_probe: ClassVar[CacheProbeText]
    """What ``modgate cache-probe`` says of this engine's cache (cli/cache_probe.py)."""
    probes_first_request: ClassVar[bool] = False
    """Whether the first-request probe (gateway/engine/first_request.py) applies to this engine."""
    props_recheck: ClassVar[bool] = False
    """Whether ``/props`` names slots worth reading again (a restart may change them)."""
    hints: ClassVar[StartupHints]

    @classmethod
    def claims_props(cls, status: int, payload: object) -> bool:
        """Whether an engine's ``GET /props`` answer shows this kind."""
        return False

    def chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body this engine takes for the gateway's chat request."""
        return body

    def model_root(self, card: dict[str, Any]) -> str:
        """The weights' identity in a ``/v1/models`` entry (part of the verdict-reuse scope)."""
        return str(card.get("root") or "")

    def place_probe(self, body: dict[str, Any], before: str, regex: str) -> dict[str, Any] | None:
        """A one-token request for the grammar's distribution where a verdict starts (after ``before``,
        held to ``regex`` from there), or None where the answer's own logprobs already are it (vLLM)."""
        return None

    def read_place(self, payload: dict[str, Any]) -> tuple[tuple[str, float], ...] | None:
        """The (token, probability) list a :meth:`place_probe` answered, or None."""
        return None

    def decision_place(
        self, body: dict[str, Any], before: str, regex: str, top_logprobs: int
    ) -> dict[str, Any]:
        """A one-token request for the distribution at a decision answer's place after ``before`` (held to
        ``regex`` from there): vLLM's list under the grammar's mask is it; ``before`` is sent as the
        assistant's start, which vLLM continues (``continue_final_message``)."""
        probe = {key: value for key, value in body.items() if key not in {"stream", "stream_options"}}
        probe.update(structured_outputs={"regex": regex}, max_completion_tokens=1, logprobs=True,
                     top_logprobs=top_logprobs)
        if before:
            probe["messages"] = [*body.get("messages", ()), {"role": "assistant", "content": before}]
            probe.update(continue_final_message=True, add_generation_prompt=False)
        return self.chat_body(probe)

    def read_decision_place(self, payload: dict[str, Any]) -> tuple[tuple[str, float], ...] | None:
        """The (token, probability) list a :meth:`decision_place` answered (the chosen token and its listed
        alternatives), or None."""
        try:
            entry = payload["choices"][0]["logprobs"]["content"][0]
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(entry, dict):
            return None
        return tuple(
            (text, probability(logprob)) for text, logprob in TokenLogprob.from_wire(entry).alternatives()
        )

    def answer_grammar(self, body: dict[str, Any]) -> str | None:
        """The regex this engine holds the answer (after any thought) to, or None where it is not a regex
        (a JSON schema): what tells a not-masked reading which tokens were admitted."""
        constraint = body.get("structured_outputs")
        return str(constraint["regex"]) if isinstance(constraint, dict) and "regex" in constraint else None

    def tokenize_steps(self, body: dict[str, Any]) -> list[TokenizeStep]:
        """The calls that count a prompt's tokens (vLLM: one ``/tokenize``, which takes messages)."""
        return [("/tokenize", lambda _previous: body)]

    def token_count(self, payload: dict[str, Any]) -> int:
        """The count in the last step's answer."""
        return int(payload["count"])

    def explain(self, message: str) -> str:
        """The engine's refusal with what to change, where the gateway knows it."""
        return message

    def says_busy(self, status: int, message: str) -> bool:
        """Whether an error answer is the engine's back-pressure (busy now), not a failure of the engine:
        every kind's busy answers, since a pool's kinds may be undetected yet."""
        return status == 503 and any(clue in message for clue in busy_answers())

    def cache_counters(self, samples: Iterable[Sample]) -> tuple[float, float] | None:
        """``(prompt tokens looked up in the prefix cache, of which found)`` from ``/metrics``, or None."""
        return None

    def cache_config(self, samples: Iterable[Sample]) -> EngineCacheConfig | None:
        """The prefix cache's configuration in ``/metrics`` (block, match unit, hybrid mode), or None."""
        return None


WIRES: Final[dict[str, EngineWire]] = {}


def register(wire: EngineWire) -> EngineWire:
    """Make a wire known by its kind (detection asks every registered wire, in registration order)."""
    WIRES[wire.kind] = wire
    return wire


def wire_for(kind: str) -> EngineWire:
    """The protocol of one engine kind."""
    return WIRES[kind]


def busy_answers() -> tuple[str, ...]:
    """Every registered kind's busy answers."""
    return tuple(clue for wire in WIRES.values() for clue in wire.busy_answers)


def read_cache_config(metrics_text: str) -> EngineCacheConfig | None:
    """The cache configuration an engine's ``/metrics`` text shows, read by the wire whose names it carries
    (None: no wire finds one, or the text is not Prometheus' format)."""
    try:
        families = list(text_string_to_metric_families(metrics_text))
        samples = [sample for family in families for sample in family.samples]
    except ValueError:
        return None
    return next((config for wire in WIRES.values() if (config := wire.cache_config(samples))), None)


def kind_from_props(status: int, payload: object) -> str:
    """The kind an engine's ``GET /props`` answer shows (no wire claiming it: :data:`DEFAULT_KIND`)."""
    for wire in WIRES.values():
        if wire.claims_props(status, payload):
            return wire.kind
    return DEFAULT_KIND
