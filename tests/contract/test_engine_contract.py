"""One engine contract, held by the simulator in both wires, the real vLLM (CPU build) and the real llama.cpp.

Every test runs four times: ``[simulator]`` (vLLM's wire), ``[vllm]``, ``[simulator-llamacpp]`` (the
simulator speaking llama-server's wire, run by llama.cpp's law with the flags ``modgate engine-llamacpp``
starts the real one with) and ``[llamacpp]``. Where a simulator and its real engine differ, the simulator
is fixed, never the assertion. Where llama.cpp differs from vLLM, the test pins what it does instead
(``engine.llamacpp``) on both llama.cpp columns, and docs/engines.md says it. Requests go through the
engine's :class:`~gateway.engine.wires.EngineWire`, as the gateway sends them.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.engine_llamacpp import CONTEXT_PER_SLOT, DEFAULT_SLOTS
from deploy.keyframes import make_keyframe
from deploy.simulator.llamacpp_law import LlamaCppOptions
from gateway.engine.wires import EngineKind, wire_for
from gateway.engine.wires.llamacpp import LLAMACPP_ALTERNATIVES_PER_MASKED
from shaping.confidence import PROBE_MAY_READ, TokenLogprob, place_exact, with_confidence
from shaping.image import ImageLimits, shape_image
from shaping.prompt import RequestOptions, build_chat_request, load_system_prompt, prompt_version_for
from shaping.tokens import TokenGrid
from shaping.verdict import (
    ACTIONS,
    MODEL_CATEGORIES,
    compact_regex,
    parse_engine_output,
    structured_outputs,
    verdict_regex,
)
from tests.support import SimFactory

# Where llama-server differs from vLLM, each assertion that cannot hold and the test that pins what it does
# instead; strict on both llama.cpp columns (a node id's "simulator-llamacpp" is looked up as "llamacpp").
LLAMACPP_DIFFERS = {
    "test_a_malformed_request_gets_the_openai_error_shape": "its error has no 'param'; stream_options "
    "without stream and max_completion_tokens -1 are accepted (200) (pinned by "
    "test_llamacpp_refuses_only_what_it_cannot_parse_and_its_error_has_no_param)",
    "test_logprobs_come_for_every_token_and_the_grammar_masks_the_verdicts_alternatives": "entries carry "
    "'id' first and the alternatives are raw (unmasked) logits (pinned by "
    "test_llamacpp_logprobs_are_a_raw_softmax_the_grammar_does_not_mask)",
    "test_streamed_logprobs_are_the_same_tokens_delta_by_delta": "no streamed entry for a token that "
    "changes no field: the stop token, the closing </think>, blanks before the thought (pinned by "
    "test_llamacpp_streams_no_logprob_entry_for_a_token_that_writes_nothing)",
}
# What the tiny random model does on the real llama-server, not the server (the real column only): it
# thinks in blanks, which llama-server's parser trims to no reasoning_content, and its raw softmax gives
# every allowed spelling 0 in float. The simulated model writes words and keeps the allowed spellings above
# 0, as a trained one does.
TINY_MODEL_ON_LLAMACPP = {
    "test_thinking_on_puts_reasoning_in_the_reasoning_field": "the tiny model's thought is blanks: no "
    "reasoning_content (pinned by test_llamacpp_puts_the_thought_in_reasoning_content_closed_or_not)",
    "test_streaming_with_include_usage_ends_with_a_usage_chunk_then_done": "the tiny model's thought is "
    "blanks: no reasoning delta (pinned by "
    "test_llamacpp_puts_the_thought_in_reasoning_content_closed_or_not)",
    "test_the_confidence_is_the_engines_own_probability_and_a_shorter_list_never_raises_it": "the raw "
    "softmax gives every allowed spelling 0 in float on the tiny model: no confidence to read (pinned by "
    "test_llamacpp_logprobs_are_a_raw_softmax_the_grammar_does_not_mask)",
}
# A real llama-server case whose request the pinning test already makes, and which costs a minute: the
# tiny model fills its 4,096-token slot when max_completion_tokens is -1. The pin asserts the same 200, so
# the day llama.cpp refuses -1 it fails there; the simulated llama.cpp column keeps the strict xfail.
RUN_BY_ITS_PIN = {
    "test_a_malformed_request_gets_the_openai_error_shape[llamacpp-negative-max-tokens]": "the same request "
    "as test_llamacpp_refuses_only_what_it_cannot_parse_and_its_error_has_no_param[llamacpp], a minute of "
    "generation to the slot's end",
}
LLAMACPP_METRIC_NAMES = (  # what the gateway reads of llama-server's /metrics (unlabelled)
    "llamacpp:prompt_tokens",
    "llamacpp:prompt_tokens_cached",
    "llamacpp:tokens_predicted",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)
METRIC_NAMES = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
)


@dataclass(frozen=True)
class Engine:
    """An engine under contract: where it is, what it serves."""

    kind: str
    url: str
    model: str

    @property
    def wire_kind(self) -> EngineKind:
        return "llamacpp" if self.llamacpp else "vllm"

    @property
    def llamacpp(self) -> bool:
        """llama-server's wire: the real one or the simulator speaking it."""
        return self.kind in LLAMACPP_COLUMNS

    def post(self, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        sent = wire_for(self.wire_kind).chat_body(body)
        return httpx.post(f"{self.url}/v1/chat/completions", json=sent, timeout=300, **kwargs)


def reasoning_of(message: dict[str, Any]) -> str | None:
    """vLLM's ``reasoning`` or llama.cpp's ``reasoning_content`` (the client reads both)."""
    return message.get("reasoning") or message.get("reasoning_content")


LLAMACPP_COLUMNS = ("simulator-llamacpp", "llamacpp")
# The simulator as `modgate engine-llamacpp` starts the real server: its slots, -c split among them, and an
# attention-only model (the tiny model's text half is Llama: its cache is cut back to no checkpoint).
SIM_LLAMACPP = LlamaCppOptions(
    n_parallel=DEFAULT_SLOTS, n_ctx=DEFAULT_SLOTS * CONTEXT_PER_SLOT, recurrent=False
)


def engine_url(request: pytest.FixtureRequest, start_sim: SimFactory, column: str) -> str:
    """Where one column's engine is: a simulator started for the test, or the session's real engine."""
    if column == "simulator":
        return start_sim("instant", time_scale=0.0, block_size=128).url
    if column == "simulator-llamacpp":
        return start_sim("instant", time_scale=0.0, kind="llamacpp", llamacpp=SIM_LLAMACPP).url
    return str(request.getfixturevalue("real_llamacpp_url" if column == "llamacpp" else "real_engine_url"))


@pytest.fixture(
    params=[
        "simulator",
        pytest.param("vllm", marks=pytest.mark.vllm),
        "simulator-llamacpp",
        pytest.param("llamacpp", marks=pytest.mark.llamacpp),
    ]
)
def engine(request: pytest.FixtureRequest, start_sim: SimFactory) -> Iterator[Engine]:
    if request.node.name in RUN_BY_ITS_PIN:
        pytest.skip(RUN_BY_ITS_PIN[request.node.name])
    if request.param in LLAMACPP_COLUMNS:
        name = request.node.name.replace("[simulator-llamacpp", "[llamacpp")
        gaps = {**LLAMACPP_DIFFERS, **(TINY_MODEL_ON_LLAMACPP if request.param == "llamacpp" else {})}
        gap = gaps.get(name) or gaps.get(request.node.originalname)
        if gap:  # strict: the day the assertion holds on llama.cpp, this fails and the entry goes
            request.applymarker(pytest.mark.xfail(strict=True, reason=gap))
    url = engine_url(request, start_sim, request.param)
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    return Engine(request.param, url, model)


@pytest.fixture(params=["simulator-llamacpp", pytest.param("llamacpp", marks=pytest.mark.llamacpp)])
def llamacpp_url(request: pytest.FixtureRequest, start_sim: SimFactory) -> str:
    """A llama.cpp column for the tests that pin what llama-server does: the simulator's, the real one."""
    return engine_url(request, start_sim, str(request.param))


def keyframe_request(
    engine: Engine,
    *,
    thinking: bool,
    stream: bool = False,
    max_tokens: int = 48,
    constraint: str = "regex",
    seed: int = 1,
) -> dict[str, Any]:
    """The gateway's own engine request for one shaped keyframe."""
    shaped = shape_image(
        make_keyframe("block:violence", 640, 360, seed=seed), ImageLimits(), TokenGrid(token_budget=128)
    )
    return build_chat_request(
        load_system_prompt(),
        [shaped],
        "请审核这张视频关键帧截图。",
        RequestOptions(
            model=engine.model,
            enable_thinking=thinking,
            max_completion_tokens=max_tokens,
            constraint=constraint,
            stream=stream,
        ),
    )


def block_size(engine: Engine) -> int:
    """The prefix-cache block size the engine reports in ``vllm:cache_config_info``."""
    for family in text_string_to_metric_families(httpx.get(f"{engine.url}/metrics", timeout=30).text):
        if family.name == "vllm:cache_config_info":
            return int(family.samples[0].labels["block_size"])
    raise AssertionError("the engine does not report vllm:cache_config_info")


def stream_events(response: httpx.Response) -> list[str]:
    return [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]


def test_a_request_without_a_model_uses_the_served_one(engine: Engine) -> None:
    body = keyframe_request(engine, thinking=False, max_tokens=8)
    del body["model"]
    response = engine.post(body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == engine.model


def test_the_gateway_request_is_accepted_as_built(engine: Engine) -> None:
    response = engine.post(keyframe_request(engine, thinking=False))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_thinking_off_gives_no_reasoning(engine: Engine) -> None:
    body = engine.post(keyframe_request(engine, thinking=False)).json()
    message = body["choices"][0]["message"]
    assert not message.get("reasoning")
    assert not message.get("reasoning_content")
    if engine.llamacpp:  # llama.cpp's usage has no completion_tokens_details: no reasoning count at all
        assert "completion_tokens_details" not in body["usage"]
    else:
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_thinking_on_puts_reasoning_in_the_reasoning_field(engine: Engine) -> None:
    body = engine.post(keyframe_request(engine, thinking=True, max_tokens=24)).json()
    message = body["choices"][0]["message"]
    if engine.llamacpp:  # --reasoning-format deepseek: the thought in reasoning_content, uncounted in usage
        assert message["reasoning_content"]
        assert "completion_tokens_details" not in body["usage"]
    else:
        assert message["reasoning"]
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_usage_details_carry_cache_and_image_tokens(engine: Engine) -> None:
    answer = engine.post(keyframe_request(engine, thinking=False)).json()
    usage = answer["usage"]
    details = usage["prompt_tokens_details"]
    if engine.llamacpp:  # cached tokens only, no image count; per-request timings beside usage
        assert set(details) == {"cached_tokens"}
        assert answer["timings"]["cache_n"] == details["cached_tokens"]
        assert answer["timings"]["prompt_n"] + answer["timings"]["cache_n"] == usage["prompt_tokens"]
    else:
        assert {"cached_tokens", "created_cache_tokens", "multimodal_tokens"} <= set(details)
        assert details["multimodal_tokens"]["image"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_repeated_prompt_is_cached_in_whole_blocks_never_the_whole_prompt(engine: Engine) -> None:
    body = keyframe_request(engine, thinking=False, seed=engine.kind.__len__() + 40)
    if engine.llamacpp:  # token by token, no block: a repeat reuses all but what must be evaluated again
        usages = [engine.post(body).json()["usage"] for _ in range(3)]
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
        prompt = usages[0]["prompt_tokens"]
        assert 0 < cached[-1] < prompt, (cached, prompt)
        assert cached[-1] >= prompt - 8, (cached, prompt)
        return
    block = block_size(engine)
    usages = [engine.post(body).json()["usage"] for _ in range(3)]
    prompt = usages[0]["prompt_tokens"]
    assert prompt > block  # else the test could not see a hit
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert all(c % block == 0 for c in cached), (cached, block)
    assert all(c < prompt for c in cached)
    assert cached[-1] > 0  # a repeat does hit
    assert cached[-1] <= (prompt - 1) // block * block


def test_metrics_carry_the_names_and_labels_the_gateway_reads(engine: Engine) -> None:
    engine.post(keyframe_request(engine, thinking=False))
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{engine.url}/metrics").text)}
    if engine.llamacpp:  # its own names, one server one model: no labels
        for name in LLAMACPP_METRIC_NAMES:
            assert name in families, f"{name} missing from /metrics"
            assert families[name].samples[0].labels == {}
        return
    for name in METRIC_NAMES:
        assert name in families, f"{name} missing from /metrics"
        labels = families[name].samples[0].labels
        assert labels.get("model_name") == engine.model, (name, labels)
        assert "engine" in labels, (name, labels)


def llamacpp_samples(url: str) -> dict[str, float]:
    """llama-server's ``/metrics`` as name → value (its names carry no labels)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_llamacpp_props_and_metrics_show_its_template_decode_calls_and_busy_slots(llamacpp_url: str) -> None:
    """What llama-server adds to the names the gateway reads: the chat template it renders in ``/props``,
    ``n_decode_total`` (one per batch decoded: a generated token each, images not counted) and the busy
    slots per decode (server-task.cpp's to_metrics; server-context.cpp's metrics_post_decode)."""
    props = httpx.get(f"{llamacpp_url}/props", timeout=30).json()
    assert "<|im_start|>" in props["chat_template"]  # the --chat-template-file it was started with
    assert "enable_thinking" in props["chat_template"]
    before = llamacpp_samples(llamacpp_url)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "chat_template_kwargs": {"enable_thinking": False}}
    answer = httpx.post(f"{llamacpp_url}/v1/chat/completions", json=body, timeout=300).json()
    after = llamacpp_samples(llamacpp_url)
    generated = answer["usage"]["completion_tokens"]
    decodes = after["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"]
    # the prompt's batch samples the first token, each further token is one more decode (the stop token
    # too, which usage may not count)
    busy = after["llamacpp:n_busy_slots_per_decode"]
    print(f"\nllama.cpp: {generated} tokens generated in {decodes} decodes, {busy} busy slots a decode")
    assert generated <= decodes <= generated + 1, (generated, decodes)
    # one request at a time in this suite: one busy slot per decode, never more than the slots
    assert 1 <= busy <= props["total_slots"]
    for name in ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"):
        assert after[f"llamacpp:{name}"] == 0  # no draft model


@pytest.mark.parametrize(
    "body",
    [
        {"model": "MODEL"},  # no messages
        {
            "model": "MODEL",
            "messages": [{"role": "user", "content": "hi"}],
            "stream_options": {"include_usage": True},
            "max_tokens": 2,  # where it is accepted (llama.cpp), not a run to the context's end
        },
        {"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1},
    ],
    ids=["no-messages", "stream-options-without-stream", "negative-max-tokens"],
)
def test_a_malformed_request_gets_the_openai_error_shape(engine: Engine, body: dict[str, Any]) -> None:
    body = json.loads(json.dumps(body).replace("MODEL", engine.model))
    response = engine.post(body)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)


def test_llamacpp_refuses_only_what_it_cannot_parse_and_its_error_has_no_param(
    llamacpp_url: str,
) -> None:
    """What llama.cpp does with the malformed requests above (pinned beside LLAMACPP_DIFFERS' entry)."""
    chat = f"{llamacpp_url}/v1/chat/completions"
    refused = httpx.post(chat, json={"model": "tiny"}, timeout=300)
    assert refused.status_code == 400
    assert refused.json() == {
        "error": {"code": 400, "message": "'messages' is required", "type": "invalid_request_error"}
    }
    hi = [{"role": "user", "content": "hi"}]
    # stream_options without stream is ignored, not refused
    body = {"messages": hi, "stream_options": {"include_usage": True}, "max_tokens": 2}
    ignored = httpx.post(chat, json=body, timeout=300)
    assert ignored.status_code == 200
    # max_completion_tokens -1 is llama.cpp's n_predict -1, "no limit": the answer runs to its stop token or
    # to the slot's context (the tiny random model never stops: it fills the slot)
    unlimited = httpx.post(chat, json={"messages": hi, "max_completion_tokens": -1}, timeout=300)
    assert unlimited.status_code == 200
    answer = unlimited.json()
    slot = httpx.get(f"{llamacpp_url}/props", timeout=30).json()["default_generation_settings"]["n_ctx"]
    if answer["choices"][0]["finish_reason"] == "length":
        assert answer["usage"]["total_tokens"] == slot, (answer["usage"], slot)
    else:
        assert answer["choices"][0]["finish_reason"] == "stop"
        assert answer["usage"]["total_tokens"] < slot


def test_streaming_with_include_usage_ends_with_a_usage_chunk_then_done(engine: Engine) -> None:
    response = engine.post(keyframe_request(engine, thinking=True, stream=True, max_tokens=24))
    assert response.status_code == 200
    events = stream_events(response)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] > 0
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-2] if json.loads(e)["choices"]]
    assert any(reasoning_of(d) for d in deltas)
    finishes = [
        json.loads(e)["choices"][0].get("finish_reason") for e in events[:-2] if json.loads(e)["choices"]
    ]
    assert finishes[-1] in ("stop", "length")


def test_the_regex_verdict_constraint_is_honoured(engine: Engine) -> None:
    body = engine.post(keyframe_request(engine, thinking=False, max_tokens=128, constraint="regex")).json()
    choice = body["choices"][0]
    if choice["finish_reason"] == "stop":
        assert re.fullmatch(verdict_regex(), choice["message"]["content"]), choice["message"]["content"]
    else:  # cut by max tokens: what came is still a prefix the constraint allowed
        assert choice["message"]["content"].startswith('{"verdict":"')


def test_the_json_schema_verdict_constraint_is_honoured(engine: Engine) -> None:
    body = engine.post(
        keyframe_request(engine, thinking=False, max_tokens=128, constraint="json_schema")
    ).json()
    choice = body["choices"][0]
    content = choice["message"]["content"] or ""
    if choice["finish_reason"] == "stop":
        verdict = json.loads(content)
        assert verdict["verdict"] in ("allow", "review", "block")
    else:
        assert content.lstrip().startswith("{")


# --- the compact verdict and its logprobs ---------------------------------------------------------------


def compact_request(engine: Engine, *, thinking: bool, stream: bool = False, top: int = 5) -> dict[str, Any]:
    """The gateway's compact-verdict request with logprobs; a short reasoning budget with thinking on."""
    body = keyframe_request(engine, thinking=thinking, stream=stream, max_tokens=128)
    body.pop("response_format", None)
    body.pop("structured_outputs", None)
    body["messages"][0]["content"] = load_system_prompt(prompt_version_for("compact")).text
    body.update(structured_outputs("compact", "regex"))
    body.update(logprobs=True, top_logprobs=top)
    if thinking:
        body["thinking_token_budget"] = 8
    return body


def streamed_choice(response: httpx.Response) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, logprob entries, finish reason) gathered from a stream."""
    content, entries, finish = "", [], None
    for event in stream_events(response):
        if event == "[DONE]":
            break
        for choice in json.loads(event)["choices"]:
            content += choice["delta"].get("content") or ""
            entries += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason") or finish
    return content, entries, finish


def test_a_complete_compact_verdict_comes_back_under_the_grammar(engine: Engine) -> None:
    body = engine.post(compact_request(engine, thinking=False)).json()
    choice = body["choices"][0]
    content = choice["message"]["content"]
    assert choice["finish_reason"] == "stop", choice  # the grammar ends the answer: no token limit reached
    assert re.fullmatch(compact_regex(), content), content
    (verdict,) = parse_engine_output(content, None, "stop").verdicts
    assert verdict.problem is None
    assert verdict.action in ("allow", "review", "block")


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_logprobs_come_for_every_token_and_the_grammar_masks_the_verdicts_alternatives(
    engine: Engine, thinking: bool
) -> None:
    body = engine.post(compact_request(engine, thinking=thinking)).json()
    choice, usage = body["choices"][0], body["usage"]
    entries = choice["logprobs"]["content"]
    for entry in entries:
        assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
        assert len(entry["top_logprobs"]) == 5
    # one entry per generated token: the reasoning, the closing </think>, the answer and the stop token
    assert len(entries) == usage["completion_tokens"]
    tokens = [entry["token"] for entry in entries]
    assert tokens[-1] == "<|im_end|>"
    if thinking:
        assert tokens.index("</think>") == usage["completion_tokens_details"]["reasoning_tokens"]
    # At the verdict's first token the logprobs are those after the grammar's mask (vLLM applies the bitmask
    # to the logits before the sampler computes even "raw" logprobs): every alternative the engine gives a
    # probability begins an action; what the grammar forbids comes at -9999.0.
    first = entries[tokens.index("</think>") + 1 if thinking else 0]
    for alternative in first["top_logprobs"]:
        if alternative["logprob"] > -9999.0:
            assert any(
                a.startswith(alternative["token"]) or alternative["token"].startswith(a) for a in ACTIONS
            )
    # ... and the gateway reads a confidence from them
    content = choice["message"]["content"]
    parsed = parse_engine_output(content, choice["message"].get("reasoning"), choice["finish_reason"])
    (verdict,) = with_confidence(parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content)
    assert verdict.confidence is not None, verdict.confidence_note
    assert 0 < verdict.confidence <= 1


LLAMACPP_ZERO_LOGPROB = -3.4028234663852886e38  # llama-server's log(0): std::numeric_limits<float>::lowest()


def test_llamacpp_logprobs_are_a_raw_softmax_the_grammar_does_not_mask(llamacpp_url: str) -> None:
    """What llama.cpp does instead of vLLM's masked logprobs (pinned beside LLAMACPP_DIFFERS' entry)."""
    engine = Engine("llamacpp", llamacpp_url, "")
    body = engine.post(compact_request(engine, thinking=False)).json()
    choice = body["choices"][0]
    entries = choice["logprobs"]["content"]
    for entry in entries:  # the token's vocabulary id comes first (tools/server/server-task.cpp)
        assert list(entry) == ["id", "token", "bytes", "logprob", "top_logprobs"]
        assert list(entry["top_logprobs"][0]) == ["id", "token", "bytes", "logprob"]
        # top_logprobs becomes n_probs, which the gateway asks four times vLLM's of (forbidden tokens take
        # slots in a raw list)
        assert len(entry["top_logprobs"]) == 5 * LLAMACPP_ALTERNATIVES_PER_MASKED
    first = entries[0]
    listed = [(a["token"], a["logprob"]) for a in first["top_logprobs"]]
    # a softmax over every logit: the listed mass is at most 1 and 0 in float reads -FLT_MAX, not -inf
    assert sum(math.exp(lp) for _, lp in listed if lp > LLAMACPP_ZERO_LOGPROB) <= 1 + 1e-6
    assert all(lp == LLAMACPP_ZERO_LOGPROB or lp <= 0 for _, lp in listed)
    # taken before the grammar: the best listed token is one the grammar forbids at the verdict's start
    best = max(listed, key=lambda pair: pair[1])[0]
    spells_an_action = any(a.startswith(best.strip()) or best.strip().startswith(a) for a in ACTIONS)
    assert not (best.strip() and spells_an_action), listed
    # the gateway's reading is the one definition, computed here without the regex engine: exact where the
    # list leaves nothing out that could move it, else null with a code a probe may fix
    content = choice["message"]["content"]
    parsed = parse_engine_output(content, None, choice["finish_reason"])
    (verdict,) = with_confidence(
        parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content,
        grammar_masked=wire_for("llamacpp").logprobs_grammar_masked, grammar=compact_regex(1),
    )
    place = first_place_list(first)
    print("\nllama.cpp first-token alternatives:", [(t[:12], p) for t, p in place[:8]], "->", verdict)
    assert_the_one_definition(verdict, place)


def first_place_list(entry: dict[str, Any]) -> list[tuple[str, float]]:
    """A llama-server logprobs entry as (token, probability): the chosen token and its listed alternatives,
    once each (0 in float where llama.cpp wrote -FLT_MAX)."""
    pairs = [(entry["token"], entry["logprob"]), *((a["token"], a["logprob"]) for a in entry["top_logprobs"])]
    listed: dict[str, float] = {}
    for token, logprob in pairs:
        listed.setdefault(token, math.exp(logprob) if logprob > LLAMACPP_ZERO_LOGPROB else 0.0)
    return list(listed.items())


# every single-frame compact answer with at most two categories: a token at the verdict's first place that
# is a prefix of one of them is one the grammar admits (none of the model's tokens is longer than these)
SINGLE_ANSWERS = ("allow", "review", *(
    "block:" + ",".join(names)
    for n in (1, 2) for names in itertools.product(MODEL_CATEGORIES, repeat=n)
))


def expected_confidence(place: list[tuple[str, float]], action: str) -> float | None:
    """The one definition, read without the regex engine: P(admitted tokens that begin ``action``) over
    P(admitted tokens), or None where the unlisted mass could move the fourth decimal."""
    admitted = {t: p for t, p in place if t and any(answer.startswith(t) for answer in SINGLE_ANSWERS)}
    unlisted = max(0.0, 1.0 - sum(p for _, p in place))
    total = sum(admitted.values())
    if total <= 0 or unlisted / (total + unlisted) > 5e-5:
        return None
    return sum(p for t, p in admitted.items() if t[0] == action[0]) / total


def assert_the_one_definition(verdict: Any, place: list[tuple[str, float]]) -> None:
    """The gateway's confidence is the exact one computed from ``place``, or null with a probe's code."""
    expected = expected_confidence(place, verdict.action)
    if expected is None:
        assert verdict.confidence is None, (verdict, place[:8])
        assert str(verdict.confidence_note).partition(":")[0] in PROBE_MAY_READ, verdict
    else:
        assert verdict.confidence == pytest.approx(expected, abs=1e-4), (verdict, place[:8])
        assert verdict.confidence_note is None


def test_llamacpp_reads_the_exact_confidence_or_none_whatever_the_list_length(llamacpp_url: str) -> None:
    """Forbidden tokens take slots of llama.cpp's raw list; what the list leaves out may be admitted, so a
    list that leaves mass out reads null (never a lower bound), and every list that reads reads the same."""
    engine = Engine("llamacpp", llamacpp_url, "")
    wire = wire_for("llamacpp")
    readings: dict[int, tuple[str, float | None, str | None]] = {}
    for n_probs in (40, 4, 2, 1):  # sent as is: the wire would ask four times each
        sent = {**wire.chat_body(compact_request(engine, thinking=False)), "top_logprobs": n_probs}
        answer = httpx.post(f"{llamacpp_url}/v1/chat/completions", json=sent, timeout=300).json()
        choice = answer["choices"][0]
        content, entries = choice["message"]["content"], choice["logprobs"]["content"]
        assert all(len(e["top_logprobs"]) == n_probs for e in entries)
        parsed = parse_engine_output(content, None, choice["finish_reason"])
        (verdict,) = with_confidence(
            parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content,
            grammar_masked=wire.logprobs_grammar_masked, grammar=compact_regex(1),
        )
        assert_the_one_definition(verdict, first_place_list(entries[0]))
        readings[n_probs] = (content, verdict.confidence, verdict.confidence_note)
    print("\nllama.cpp confidence by n_probs (answer, confidence, note):", readings)
    assert len({content for content, _, _ in readings.values()}) == 1  # greedy: the same answer each time
    assert len({round(c, 4) for _, c, _ in readings.values() if c is not None}) <= 1, readings


def first_place(url: str) -> tuple[list[tuple[str, float]], Any]:
    """The list at the verdict's first token of a thinking-off compact answer, and the gateway's reading of
    the answer's confidence."""
    engine = Engine("llamacpp", url, "")
    body = engine.post(compact_request(engine, thinking=False, top=10)).json()
    choice = body["choices"][0]
    content, entries = choice["message"]["content"], choice["logprobs"]["content"]
    parsed = parse_engine_output(content, None, choice["finish_reason"])
    (verdict,) = with_confidence(
        parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content,
        grammar_masked=wire_for("llamacpp").logprobs_grammar_masked, grammar=compact_regex(1),
    )
    return first_place_list(entries[0]), verdict


def admitted_at_the_start(token: str, action: str) -> bool:
    """Whether the single-frame compact grammar (thinking off) admits ``token`` as the first piece of
    ``action``."""
    return bool(token) and token[0] == action[0] and any(a.startswith(token) for a in SINGLE_ANSWERS)


def truth_at_most(listed: list[tuple[str, float]], action: str) -> float:
    """The most the grammar's P(action) at the first place can be, given the raw list: the action's
    admitted spellings and all the unlisted mass over that and the other actions' admitted spellings."""
    unlisted = max(0.0, 1.0 - sum(p for _, p in listed))
    own = sum(p for t, p in listed if admitted_at_the_start(t, action)) + unlisted
    others = sum(p for t, p in listed for a in ACTIONS if a != action and admitted_at_the_start(t, a))
    return own / (own + others) if own + others > 0 else 1.0


def test_llamacpp_twins_the_grammar_forbids_are_left_out_of_the_exact_confidence(llamacpp_url: str) -> None:
    """A raw list holds the verdict's near twins (``Allow``, `` allow``, ``allowed``); the reading counts only
    what the grammar admits: the exact share computed from the list, or null with the reason."""
    listed, verdict = first_place(llamacpp_url)
    print("\nllama.cpp first place:", [(t[:12], round(p, 4)) for t, p in listed], "->", verdict.confidence)
    assert_the_one_definition(verdict, listed)
    if verdict.confidence is not None:
        assert verdict.confidence <= truth_at_most(listed, verdict.action) + 1e-4


@pytest.mark.llamacpp
def test_llamacpp_reads_the_grammars_distribution_after_its_sampler_chain_only_at_temperature_1(
    real_llamacpp_url: str,
) -> None:
    """What the gateway's verdict-place probe rests on (LlamaCppWire.place_probe): the same request read
    after the chain reads 1.0 for the greedy token at temperature 0; at temperature 1 with nothing truncated
    (where the draw without the grammar was forbidden, so it drew again under it) it lists only what the
    grammar admits, summing to 1: the tiny model's raw softmax gives those tokens 0 in float."""
    engine = Engine("llamacpp", real_llamacpp_url, "")
    wire = wire_for("llamacpp")
    body = compact_request(engine, thinking=False)
    greedy = {**wire.chat_body(body), "post_sampling_probs": True}
    greedy.pop("stream", None)
    first = httpx.post(f"{real_llamacpp_url}/v1/chat/completions", json=greedy, timeout=300).json()
    entry = first["choices"][0]["logprobs"]["content"][0]
    assert [(a["token"], a["prob"]) for a in entry["top_probs"]] == [(entry["token"], 1.0)]
    places = []
    for seed in (0, 1, 2):  # the model's logits do not depend on the seed: neither does the grammar's list
        probe = wire.place_probe({**body, "seed": seed}, "", compact_regex(1))
        assert probe is not None
        answer = httpx.post(f"{real_llamacpp_url}/v1/chat/completions", json=probe, timeout=300).json()
        place = wire.read_place(answer)
        assert place is not None
        places.append(place)
    print("\nllama.cpp verdict place after the chain at temperature 1:", [p[:6] for p in places])
    for place in places:
        # the first draw without the grammar was forbidden (the raw softmax gives the admitted tokens 0 in
        # float), so it drew again under it: only admitted tokens listed, summing to 1, the same each seed
        assert sum(p for _, p in place) == pytest.approx(1.0, abs=1e-3)
        assert all(any(admitted_at_the_start(t, a) for a in ACTIONS) for t, _ in place), place
        assert place_exact(place, "", compact_regex(1))
        assert dict(place) == pytest.approx(dict(places[0]), rel=1e-4)
    with_mass = {a for a in ACTIONS if any(admitted_at_the_start(t, a) and p > 0 for t, p in places[0])}
    assert with_mass == set(ACTIONS)
    # greedy decoding under the grammar takes the token the grammar's distribution ranks first: the answer's
    # own first token is the probe list's best, and the gateway's confidence is exactly its action's share
    (best, _), *_ = sorted(places[0], key=lambda pair: -pair[1])
    greedy_body = engine.post(compact_request(engine, thinking=False)).json()
    choice = greedy_body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert entries[0]["token"] == best
    content = choice["message"]["content"]
    (verdict,) = with_confidence(
        parse_engine_output(content, None, choice["finish_reason"]).verdicts,
        [TokenLogprob.from_wire(e) for e in entries], content, grammar_masked=False,
        grammar=compact_regex(1), places={0: places[0]},
    )
    assert verdict.confidence == pytest.approx(expected_confidence(list(places[0]), verdict.action), abs=1e-4)


def test_the_simulated_llamacpp_lists_twins_that_a_reader_crediting_them_would_read_above_the_truth(
    request: pytest.FixtureRequest, start_sim: SimFactory
) -> None:
    """The simulator's raw list holds the chosen action's twins, so the contract test above catches a
    reader that credits them (as every case-blind spelling of the word was once credited)."""
    listed, verdict = first_place(engine_url(request, start_sim, "simulator-llamacpp"))
    word = verdict.action
    twins = {t for t, p in listed if p > 0 and t.strip().lower().startswith(word) and t != word}
    assert {word.capitalize(), " " + word, word + "ed"} <= twins, listed
    unlisted = max(0.0, 1.0 - sum(p for _, p in listed))
    spelled = {a: sum(p for t, p in listed if t.strip().lower().startswith(a)) for a in ACTIONS}
    credited_twins = spelled[word] / (sum(spelled.values()) + unlisted)
    # above the most the truth can be (by less where the model is surer: 1 - P(others) is then near 1)
    assert credited_twins > truth_at_most(listed, word) + 1e-3
    assert verdict.confidence is not None
    assert verdict.confidence <= truth_at_most(listed, word) + 1e-4  # the confidence is said to 4 places


def test_the_confidence_is_the_engines_own_probability_and_a_shorter_list_never_raises_it(
    engine: Engine,
) -> None:
    readings: dict[int, tuple[str, float | None, float]] = {}
    for top in (20, 3, 1):
        answer = engine.post(compact_request(engine, thinking=False, top=top)).json()
        choice = answer["choices"][0] if "choices" in answer else pytest.fail(str(answer))
        content, entries = choice["message"]["content"], choice["logprobs"]["content"]
        parsed = parse_engine_output(content, None, choice["finish_reason"])
        (verdict,) = with_confidence(parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content)
        listed = sum(math.exp(a["logprob"]) for a in entries[0]["top_logprobs"] if a["logprob"] > -9999.0)
        readings[top] = (content, verdict.confidence, listed)
    print("\nconfidence by top_logprobs, (answer, confidence, listed mass at the first token):", readings)
    assert len({content for content, _, _ in readings.values()}) == 1  # greedy: the same answer each time
    confidence = {top: reading[1] for top, reading in readings.items()}
    assert all(c is not None for c in confidence.values()), confidence
    # under the grammar the first token's logprobs are taken over what it allows: what is listed sums to at
    # most 1 (and the 20 best hold nearly all of it), so nothing needs renormalising
    assert readings[20][2] <= 1 + 1e-3
    # a shorter list can only leave a spelling of the chosen action out: the reading falls, never rises
    assert confidence[1] <= confidence[3] + 1e-6 <= confidence[20] + 2e-6  # type: ignore[operator]  # not None


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_streamed_logprobs_are_the_same_tokens_delta_by_delta(engine: Engine, thinking: bool) -> None:
    whole = engine.post(compact_request(engine, thinking=thinking)).json()["choices"][0]
    content, entries, finish = streamed_choice(
        engine.post(compact_request(engine, thinking=thinking, stream=True))
    )
    assert [e["token"] for e in entries] == [e["token"] for e in whole["logprobs"]["content"]]
    assert (content, finish) == (whole["message"]["content"], whole["finish_reason"])
    parsed = parse_engine_output(content, None, finish)
    (verdict,) = with_confidence(parsed.verdicts, [TokenLogprob.from_wire(e) for e in entries], content)
    (whole_verdict,) = with_confidence(
        parsed.verdicts, [TokenLogprob.from_wire(e) for e in whole["logprobs"]["content"]], content
    )
    assert verdict.confidence == pytest.approx(whole_verdict.confidence)


def writes_nothing(token: str) -> bool:
    """A token that changes no field of llama-server's parsed message: the stop token (``""``), a blank, or
    a piece of the closing tag."""
    return not token.strip() or token.strip() in THINK_CLOSE


THINK_CLOSE = "</think>"


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_llamacpp_streams_no_logprob_entry_for_a_token_that_writes_nothing(
    llamacpp_url: str, thinking: bool
) -> None:
    """What llama.cpp streams instead of every entry (pinned beside LLAMACPP_DIFFERS' entry): a chunk, and
    its entry, only for a token that changed the parsed message (and the first, whose chunk names the
    role); the whole answer lists every token, the stop token as ``""``."""
    engine = Engine("llamacpp", llamacpp_url, "")
    whole = engine.post(compact_request(engine, thinking=thinking)).json()["choices"][0]
    content, entries, finish = streamed_choice(
        engine.post(compact_request(engine, thinking=thinking, stream=True))
    )
    assert (content, finish) == (whole["message"]["content"], whole["finish_reason"])
    listed = [e["token"] for e in whole["logprobs"]["content"]]
    streamed = [e["token"] for e in entries]
    if finish == "stop":
        assert listed[-1] == ""
    assert streamed[0] == listed[0]
    left_out, at = [], 0  # the streamed tokens are the listed ones in order, the rest write nothing
    for token in listed:
        if at < len(streamed) and streamed[at] == token:
            at += 1
        else:
            left_out.append(token)
    assert at == len(streamed), (streamed, listed)
    assert left_out
    assert all(writes_nothing(token) for token in left_out), left_out
    if not thinking:
        assert finish == "stop"
        assert streamed == listed[:-1]  # only the stop token
        # the confidence does not need the stop token's entry: both read the same (or say the same reason)
        parsed = parse_engine_output(content, None, finish)
        readings = [
            with_confidence(
                parsed.verdicts, [TokenLogprob.from_wire(e) for e in got], content, grammar_masked=False
            )[0]
            for got in (entries, whole["logprobs"]["content"])
        ]
        assert readings[0].confidence == readings[1].confidence
        assert readings[0].confidence_note == readings[1].confidence_note


def forced(llamacpp_url: str, text: str, *, stream: bool = False, **body: Any) -> httpx.Response:
    """A chat answered under a grammar that admits one text, thinking on: what any model must write."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    request = {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": True},
        "grammar": f'root ::= "{escaped}"\n',
        "max_tokens": 32,
        "stream": stream,
        **body,
    }
    return httpx.post(f"{llamacpp_url}/v1/chat/completions", json=request, timeout=300)


def test_llamacpp_puts_the_thought_in_reasoning_content_closed_or_not(llamacpp_url: str) -> None:
    """Where llama.cpp returns the thought (pinned beside TINY_MODEL_ON_LLAMACPP's entries): with
    ``--reasoning-format deepseek`` and a template whose think block llama.cpp can find, the text before
    ``</think>`` is ``reasoning_content`` whether the thought closed or not (as vLLM's ``reasoning``), the
    closing tag and the line breaks after it belong to no field, and a thought of blanks is trimmed away:
    no ``reasoning_content`` at all (what the tiny model's blank thoughts show)."""
    def answer(text: str, **body: Any) -> tuple[str, dict[str, Any]]:
        choice = forced(llamacpp_url, text, **body).json()["choices"][0]
        return choice["finish_reason"], choice["message"]

    assert answer("abc def</think>\n\nallow") == (
        "stop", {"role": "assistant", "content": "allow", "reasoning_content": "abc def"}
    )
    assert answer("abc def") == ("stop", {"role": "assistant", "content": "", "reasoning_content": "abc def"})
    finish, cut = answer("abc def ghi jkl mno pqr", max_tokens=3)
    assert finish == "length"
    assert cut["content"] == ""
    assert cut["reasoning_content"].startswith("abc def")
    assert answer("     </think>\n\nallow") == ("stop", {"role": "assistant", "content": "allow"})
    # streamed: the thought in reasoning_content deltas, the answer in content ones, the tag in neither
    events = stream_events(forced(llamacpp_url, "abc def</think>\n\nallow", stream=True))
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1] if json.loads(e)["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "abc def"
    assert "".join(d.get("content") or "" for d in deltas) == "allow"
    assert not any("think" in str(d) for d in deltas)


def test_llamacpp_closes_the_thought_at_the_reasoning_budget_inside_the_grammar(llamacpp_url: str) -> None:
    """``reasoning_budget_tokens`` (the gateway's ``thinking_token_budget``): llama.cpp writes ``</think>``
    once the thought has that many tokens, and the verdict's grammar (the thought rule) admits it."""
    engine = Engine("llamacpp", llamacpp_url, "")
    body = compact_request(engine, thinking=True)
    budget = body["thinking_token_budget"]
    listed = [e["token"] for e in engine.post(body).json()["choices"][0]["logprobs"]["content"]]
    assert THINK_CLOSE in listed, listed[: budget + 2]
    assert listed.index(THINK_CLOSE) <= budget


def test_the_compact_forms_cost_a_handful_of_tokens_on_the_engines_tokenizer(engine: Engine) -> None:
    def count(text: str) -> int:
        if engine.llamacpp:  # its /tokenize takes "content" and lists the tokens
            body = {"content": text, "add_special": False}
            return len(httpx.post(f"{engine.url}/tokenize", json=body, timeout=30).json()["tokens"])
        body = {"model": engine.model, "prompt": text, "add_special_tokens": False}
        return int(httpx.post(f"{engine.url}/tokenize", json=body, timeout=30).json()["count"])

    stop = 1  # the stop token is generated too (the last logprob entry above)
    assert count("allow") + stop <= 3
    assert count("review") + stop <= 3
    for name in MODEL_CATEGORIES:  # Qwen's BPE: block:violence/graphic is the longest, 6 tokens
        assert count(f"block:{name}") + stop <= 7, name
    assert count('{"verdict":"allow","categories":[],"confidence":0.93}') >= 5 * count("allow")
