"""llama.cpp's ``llama-server`` (read from its tools/server sources).

The regex becomes a GBNF ``grammar`` (:mod:`gateway.engine.wires.gbnf`); ``thinking_token_budget`` becomes
``reasoning_budget_tokens``; no ``priority``; logprobs are softmax over the raw logits (not grammar-masked:
shaping.confidence reads the verdict's probability among what the grammar's regex admits, exact or null, and
four times vLLM's alternatives are asked); where that raw list cannot give a thinking-off verdict's exact
confidence, a one-token probe at temperature 1 reads the distribution after the sampler chain
(``place_probe``);
``/tokenize`` takes text (``/apply-template`` renders the messages first) and counts no image tokens; its
cache counters are ``llamacpp:prompt_tokens_total`` (processed, cached excluded) and
``llamacpp:prompt_tokens_cached_total``; ``/props`` names its ``--parallel`` slots (``total_slots``) and
whether it has a vision projector, which is how it is told from vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Final

from prometheus_client.samples import Sample

from gateway.engine.wires.base import CacheProbeText, EngineWire, StartupHints, TokenizeStep
from gateway.engine.wires.gbnf import regex_to_gbnf
from gateway.errors import UpstreamError


class LlamaCppWire(EngineWire):
    """llama.cpp's ``llama-server`` (started with ``--jinja``, ``--metrics``; vision with ``--mmproj``)."""

    kind: ClassVar[str] = "llamacpp"
    logprobs_grammar_masked: ClassVar[bool] = False
    counts_image_tokens: ClassVar[bool] = False
    first_chunk_is_a_token: ClassVar[bool] = True  # server-task.cpp: the role delta when n_decoded == 1
    # with no idle slot where it is asked to refuse (ERROR_TYPE_UNAVAILABLE: 503, type unavailable_error);
    # it otherwise holds a request until a slot frees.
    busy_answers: ClassVar[tuple[str, ...]] = ("no slot available",)
    prefix_reuse: ClassVar[str | None] = (
        "llama.cpp reuses a slot's prompt token by token (and its context checkpoints): the shared prefix "
        "hits as it is"
    )
    block_note: ClassVar[str | None] = "llama.cpp, token by token"
    cache_probe: ClassVar[CacheProbeText] = CacheProbeText(
        counter_names="llamacpp:prompt_tokens_cached_total / prompt_tokens_total",
        no_block="none: llama.cpp reuses a slot's common prefix token by token",
        repeat_missed=(
            "the repeated probe got no cached tokens: llama-server reuses a slot's prompt token by token "
            "unless --cache-prompt is off (--no-cache-prompt, LLAMA_ARG_CACHE_PROMPT=false); a hybrid model "
            "reuses only back to a context checkpoint, and --ctx-checkpoints 0 keeps none"
        ),
        production_missed=(
            "the production-shaped request got 0 of {n:,} tokens from the cache: llama-server reuses only "
            "what the slot it lands on holds (the most similar idle slot above --slot-prompt-similarity, "
            "else the least recently used one), and a hybrid model only back to a checkpoint, which it saves "
            "before the last user message (--ctx-checkpoints)"
        ),
    )
    props_recheck: ClassVar[bool] = True  # a restart with another --parallel changes total_slots
    hints: ClassVar[StartupHints] = StartupHints(
        served_name_flag="--alias",
        grammar_fix="llama.cpp's server built with grammar support",
        logprobs_fix="llama.cpp's server with n_probs support",
        logprobs_short_fix="a llama.cpp server that returns top_logprobs",
        cached_tokens_fix="a llama.cpp server that reports prompt_tokens_details",
        reasoning_fix="--jinja --reasoning-format deepseek",
        prefix_cache_kept="llama-server reuses each slot's prompt",
        publishes_slots=True,
    )

    @classmethod
    def claims_props(cls, status: int, payload: object) -> bool:
        """llama-server's ``/props`` names its slots (``total_slots``), or is 503 while it loads; vLLM serves
        none."""
        return status == 503 or (status == 200 and isinstance(payload, dict) and "total_slots" in payload)

    def chat_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """Regex to GBNF, the reasoning budget by llama.cpp's name, no vLLM-only fields."""
        out = {key: value for key, value in body.items() if key not in _VLLM_ONLY}
        constraint = body.get("structured_outputs")
        if isinstance(constraint, dict) and "regex" in constraint:
            grammar = regex_to_gbnf(str(constraint["regex"]))
            if thinking_on(body):
                # llama.cpp holds the grammar from the first generated token (vLLM: after the reasoning);
                # the template opened <think>, so the grammar lets the thought run to </think> first.
                grammar = THOUGHT_RULES + grammar.replace("root ::= ", "verdict ::= ", 1)
            out["grammar"] = grammar
        if body.get("thinking_token_budget") is not None:
            out["reasoning_budget_tokens"] = body["thinking_token_budget"]
        if body.get("logprobs") and isinstance(body.get("top_logprobs"), int):
            out["top_logprobs"] = body["top_logprobs"] * LLAMACPP_ALTERNATIVES_PER_MASKED
        messages = body.get("messages")
        if isinstance(messages, list):
            out["messages"] = [_without_uuids(message) for message in messages]
        return out

    def answer_grammar(self, body: dict[str, Any]) -> str | None:
        """The regex, after the line breaks :data:`THOUGHT_RULES` lets follow a thought when thinking is on
        (the answer's tokens may start with them)."""
        regex = super().answer_grammar(body)
        return None if regex is None else ("\\n{0,2}(?:" + regex + ")" if thinking_on(body) else regex)

    def place_probe(self, body: dict[str, Any], before: str, regex: str) -> dict[str, Any] | None:
        """The gateway's thinking-off request cut to the verdict's first token, sampled at temperature 1
        with nothing truncated and read after llama.cpp's sampler chain (``post_sampling_probs``), drawn
        with ``body``'s ``seed`` (0 if none: a caller that asks again gives another).

        ``common_sampler_sample`` (common/sampling.cpp, ``grammar_first`` false in the server) draws first
        from the chain without the grammar. Where that draw is a token the grammar admits it is kept, and
        the candidates the server lists (``populate_token_probs``: the chain's, sorted, zeros dropped) are
        the raw softmax over the whole vocabulary: tokens the grammar forbids listed among them. Where it is
        forbidden, the logits are set again, the grammar sets every forbidden one to -inf and the chain
        draws again: the list is then the model's probabilities renormalised over what the grammar admits
        (what constrained decoding samples from), forbidden tokens at 0 and dropped. Either way the list is
        a distribution over the whole vocabulary, so shaping.confidence reads both alike: exact where the
        unlisted mass cannot move the reading, null otherwise. A first draw is admitted with the raw
        softmax's admitted mass, so another seed is another chance of the renormalised list. At temperature
        0 the list reads 1.0 for the greedy token (the ``temp`` sampler keeps one logit), so the answer
        itself cannot carry it. The probe's draw is thrown away: the verdict stays the greedy one.
        ``before``: the answer up to the verdict (earlier frames' lines), sent as the assistant's start,
        which llama-server continues.
        """
        if thinking_on(body) or not isinstance(body.get("structured_outputs"), dict):
            return None
        messages = list(body.get("messages") or [])
        if before:
            messages.append({"role": "assistant", "content": before})
        probe = {key: value for key, value in body.items() if key not in {"stream", "stream_options"}}
        probe.update(
            messages=messages, structured_outputs={"regex": regex}, max_completion_tokens=1,
            logprobs=True, top_logprobs=body.get("top_logprobs") or 1,
        )
        return {**self.chat_body(probe), **PLACE_SAMPLING, "seed": int(body.get("seed") or 0)}

    def read_place(self, payload: dict[str, Any]) -> tuple[tuple[str, float], ...] | None:
        """``choices[0].logprobs.content[0].top_probs``: probabilities, not logprobs, after the chain."""
        try:
            entry = payload["choices"][0]["logprobs"]["content"][0]
            return tuple((str(alt["token"]), float(alt["prob"])) for alt in entry["top_probs"])
        except (KeyError, IndexError, TypeError, ValueError):
            return None

    def decision_place(
        self, body: dict[str, Any], before: str, regex: str, top_logprobs: int
    ) -> dict[str, Any]:
        """The verdict-place probe (:meth:`place_probe`) at a decision answer's place: the distribution after
        llama.cpp's sampler chain, drawn with ``body``'s seed (a decision asks thinking off)."""
        probe = self.place_probe(
            {**body, "structured_outputs": {"regex": regex}, "top_logprobs": top_logprobs}, before, regex
        )
        if probe is None:
            raise ValueError("a decision place is asked thinking off, with a grammar")
        return probe

    def read_decision_place(self, payload: dict[str, Any]) -> tuple[tuple[str, float], ...] | None:
        """As a verdict place: probabilities after the chain."""
        return self.read_place(payload)

    def tokenize_steps(self, body: dict[str, Any]) -> list[TokenizeStep]:
        """``/apply-template`` renders the messages, ``/tokenize`` counts the text (special tokens parsed)."""
        def count(text: str) -> dict[str, Any]:
            return {"content": text, "add_special": False, "parse_special": True}

        if "messages" not in body:
            return [("/tokenize", lambda _previous: count(str(body.get("prompt", ""))))]
        if any(_has_image(message) for message in body["messages"]):
            raise UpstreamError(
                "llama.cpp's /tokenize counts text only (an image's tokens come from its mmproj at prefill)",
                code="engine_cannot_count_images",
            )
        template: dict[str, Any] = {
            key: body[key] for key in ("messages", "chat_template_kwargs") if key in body
        }
        template["add_generation_prompt"] = bool(body.get("add_generation_prompt", True))
        return [("/apply-template", lambda _previous: template),
                ("/tokenize", lambda previous: count(str(previous["prompt"])))]

    def token_count(self, payload: dict[str, Any]) -> int:
        """``{"tokens": [...]}``: the count is its length."""
        return len(payload["tokens"])

    def explain(self, message: str) -> str:
        """llama-server's refusals, each with the setting that fixes it."""
        for clue, advice in _LLAMACPP_ADVICE:
            if clue in message:
                return f"{message} ({advice})"
        return message

    def model_root(self, card: dict[str, Any]) -> str:
        """llama.cpp lists no weights path; its kind and the model's size and type stand for it."""
        meta = card.get("meta")
        if not isinstance(meta, dict):
            meta = {}
        return "llamacpp:" + ":".join(str(meta.get(key, "")) for key in ("n_params", "size", "ftype"))

    def cache_counters(self, samples: Iterable[Sample]) -> tuple[float, float] | None:
        """Looked up = processed + reused (``prompt_tokens_total`` excludes what the cache held)."""
        processed = cached = None
        for sample in samples:
            if sample.name == "llamacpp:prompt_tokens_total":
                processed = sample.value
            elif sample.name == "llamacpp:prompt_tokens_cached_total":
                cached = sample.value
        return None if processed is None or cached is None else (processed + cached, cached)


LLAMACPP_ALTERNATIVES_PER_MASKED: Final = 4
"""llama.cpp's ``n_probs`` per alternative vLLM would list under the grammar's mask (10 → 40).

Its alternatives are the raw softmax's best (``get_token_probabilities``, server-common.cpp: every logit,
before the grammar), so tokens the grammar forbids take slots an allowed spelling would have had under
vLLM's mask. At a verdict's first place each allowed spelling (``allow``, `` block``) has near twins the
grammar forbids that a model ranks beside it: the word capitalised, after a line break, in quotes or
markdown; three of those per spelling is four slots for each one vLLM needs. The confidence stays a lower
bound whatever is cut (shaping.confidence counts the unlisted mass as allowed); the factor only decides how
tight it reads. Its cost: JSON on every generated token, the thought's included: about 90 bytes an
alternative for a word-sized piece (40: 3.5 kB a token against vLLM's 10 of 76 bytes, 0.8 kB); on the tiny
test model, whose pieces are long runs of blanks, 17.3 kB a token against 5.5 kB at 10 (measured, no
per-token time difference above the noise at load 6-17). llama.cpp sets no limit on ``n_probs`` (a partial
sort over the vocabulary's logits picks them)."""

PLACE_SAMPLING: Final[dict[str, Any]] = {
    "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
    "xtc_probability": 0.0, "post_sampling_probs": True,
}
"""A verdict-place probe's sampler settings: the model's own probabilities (temperature 1, no truncation,
no penalty), read after the chain (llama-server's ``params_from_json_cmpl`` names, server-schema.cpp)."""

THOUGHT_RULES: Final = 'root ::= thought verdict\nthought ::= [^<]* "</think>" "\\n"{0,2}\n'
"""The reasoning before the verdict, in GBNF: anything up to ``</think>``, then at most the two line breaks
Qwen3's template writes after it. Unbounded (``"\n"*``), a model whose best token is a line break (the tiny
test model's is) wrote them after the thought until ``max_completion_tokens`` and no verdict came: a
thinking-on request closed by its reasoning budget ran 512 tokens and came back ``review``."""


def thinking_on(body: dict[str, Any]) -> bool:
    """Whether the request asks for reasoning (``chat_template_kwargs.enable_thinking``, default on)."""
    kwargs = body.get("chat_template_kwargs")
    return not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)


_LLAMACPP_ADVICE: Final = (
    ("image input is not supported",
     "this llama-server has no vision projector: start it with --mmproj <mmproj.gguf>, as "
     "`modgate engine-llamacpp` does, or send text only"),
    ("exceeds the available context size",
     "one slot's context is -c divided by --parallel: raise llama-server's -c, lower --parallel, or send "
     "fewer or smaller frames per request (MODGATE_SHAPING__IMAGE_TOKEN_BUDGET)"),
)

# priority: llama.cpp schedules first come first served; structured_outputs/thinking_token_budget are
# re-said above in its own terms.
_VLLM_ONLY: Final = frozenset({"structured_outputs", "thinking_token_budget", "priority"})


def _has_image(message: object) -> bool:
    """Whether a chat message carries an image part."""
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "image_url" for part in content
    )


def _without_uuids(message: object) -> object:
    """A message without vLLM's per-image ``uuid`` (llama.cpp hashes the image bytes itself)."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = [
        {key: value for key, value in part.items() if key != "uuid"} if isinstance(part, dict) else part
        for part in message["content"]
    ]
    return {**message, "content": parts}


