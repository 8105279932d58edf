"""One protocol per engine kind: what a llama.cpp server is sent and how what it serves is read.

The real llama-server holds these in tests/contract; here each translation is pinned on its own, with
fakes (``httpx.MockTransport``) where an engine must answer.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, ClassVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.client import EngineClient
from gateway.engine.wires import WIRES, EngineWire, LlamaCppWire, kind_from_props, register, wire_for
from gateway.engine.wires.gbnf import regex_to_gbnf
from gateway.engine.wires.llamacpp import THOUGHT_RULES
from gateway.errors import EngineUnavailable, UpstreamError
from gateway.settings import EngineSettings
from gateway.telemetry.windows import read_engine_cache_counters
from shaping.verdict import compact_regex, structured_outputs, verdict_regex

LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 900
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def test_a_literal_regex_becomes_one_gbnf_string() -> None:
    assert regex_to_gbnf(r"\{a\.b\}") == 'root ::= "{a.b}"\n'


def test_alternation_groups_and_quantifiers_keep_their_shape_in_gbnf() -> None:
    grammar = regex_to_gbnf(r"(allow|block:(a|b)(,(a|b)){0,1})(\n(x|y)){2}[0-9]?")
    assert grammar == (
        'root ::= (("allow" | "block:" (("a" | "b")) ("," (("a" | "b"))){0,1}))'
        ' ("\\n" (("x" | "y"))){2} [0-9]?\n'
    )


def test_the_verdict_regexes_translate_and_name_every_category() -> None:
    for pattern in (compact_regex(1), compact_regex(3), verdict_regex()):
        grammar = regex_to_gbnf(pattern)
        assert grammar.startswith("root ::= ")
        assert grammar.count("(") == grammar.count(")")
    assert '"violence/graphic"' in regex_to_gbnf(compact_regex(1))
    assert '"\\n"' in regex_to_gbnf(compact_regex(2))  # the packed frames' separator, escaped for GBNF


@pytest.mark.parametrize("pattern", [r"a.b", r"^allow$", r"\d+", r"(ab", r"a{x}"])
def test_a_construct_the_translator_does_not_know_is_refused_by_name(pattern: str) -> None:
    with pytest.raises(ValueError, match="not translatable to GBNF"):
        regex_to_gbnf(pattern)


def gateway_body(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}, "uuid": "ab12"},
                {"type": "text", "text": "judge"},
            ]},
        ],
        "chat_template_kwargs": {"enable_thinking": True},
        "thinking_token_budget": 16,
        "priority": 3,
        **structured_outputs("compact", "regex"),
    }  # fmt: skip
    body.update(extra)
    return body


def test_llamacpp_is_sent_a_gbnf_grammar_its_reasoning_budget_and_no_vllm_only_field() -> None:
    sent = LlamaCppWire().chat_body(gateway_body())
    assert "structured_outputs" not in sent
    assert "priority" not in sent
    assert "thinking_token_budget" not in sent
    # thinking on: the grammar lets the thought run to </think> before the verdict (kinds.THOUGHT_RULES)
    verdict = regex_to_gbnf(compact_regex(1)).replace("root ::= ", "verdict ::= ", 1)
    assert sent["grammar"] == THOUGHT_RULES + verdict
    assert sent["reasoning_budget_tokens"] == 16
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}  # --jinja renders it
    image_part = sent["messages"][1]["content"][0]
    assert "uuid" not in image_part
    assert image_part["image_url"]["url"].startswith("data:image/jpeg")


def test_vllm_is_sent_the_body_as_the_gateway_built_it() -> None:
    body = gateway_body()
    assert wire_for("vllm").chat_body(body) is body


def test_a_json_schema_verdict_goes_to_llamacpp_as_the_openai_response_format() -> None:
    body = gateway_body(**structured_outputs("json", "json_schema"))
    del body["structured_outputs"]
    sent = LlamaCppWire().chat_body(body)
    assert sent["response_format"]["type"] == "json_schema"
    assert "grammar" not in sent


def test_the_kind_is_what_props_shows() -> None:
    assert kind_from_props(200, {"total_slots": 4, "build_info": "b1"}) == "llamacpp"
    assert kind_from_props(404, {"detail": "Not Found"}) == "vllm"
    assert kind_from_props(200, {"something": "else"}) == "vllm"


def test_llamacpps_cache_counters_read_as_looked_up_and_reused() -> None:
    counters = read_engine_cache_counters(LLAMACPP_METRICS)
    assert (counters.queries, counters.hits) == (1200.0, 900.0)  # processed 300 + reused 900
    assert counters.block_size is None  # llama.cpp matches token by token: no block
    samples = [s for f in text_string_to_metric_families(LLAMACPP_METRICS) for s in f.samples]
    assert wire_for("vllm").cache_counters(samples) is None


def test_metrics_without_any_engines_cache_counters_are_refused_with_both_names() -> None:
    with pytest.raises(ValueError, match=r"llamacpp:prompt_tokens_total / prompt_tokens_cached_total"):
        read_engine_cache_counters("# TYPE other counter\nother_total 1\n")


def test_llamacpp_counts_tokens_by_rendering_the_template_then_tokenizing_the_text() -> None:
    wire = LlamaCppWire()
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    (template_path, template), (tokenize_path, tokenize) = wire.tokenize_steps(body)
    assert (template_path, tokenize_path) == ("/apply-template", "/tokenize")
    assert template({})["add_generation_prompt"] is True
    assert tokenize({"prompt": "<|im_start|>user"}) == {
        "content": "<|im_start|>user", "add_special": False, "parse_special": True,
    }
    assert wire.token_count({"tokens": [1, 2, 3]}) == 3


def test_llamacpp_cannot_count_an_images_tokens_and_says_so() -> None:
    with pytest.raises(UpstreamError, match="counts text only"):
        LlamaCppWire().tokenize_steps(gateway_body())


def test_a_refusal_from_llamacpp_says_what_to_change() -> None:
    explained = LlamaCppWire().explain("image input is not supported - hint: ...")
    assert "--mmproj" in explained
    assert "--parallel" in LlamaCppWire().explain("request (5000 tokens) exceeds the available context size")
    assert wire_for("vllm").explain("whatever") == "whatever"


def test_the_kind_is_set_per_engine_url_over_the_default() -> None:
    settings = EngineSettings(kind="vllm", kinds="http://b:8080=llamacpp,http://c:8000/=auto")
    assert settings.kind_of("http://b:8080") == "llamacpp"
    assert settings.kind_of("http://c:8000") == "auto"
    assert settings.kind_of("http://a:8000") == "vllm"
    with pytest.raises(ValueError, match="MODGATE_ENGINE__KINDS"):
        EngineSettings(kinds="http://b:8080=sglang")


def llamacpp_handler(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    """A fake llama-server: ``/props`` with 3 slots and a compact answer to every chat request."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": 3, "modalities": {"vision": True}})
        if request.url.path == "/v1/models":
            meta = {"n_params": 7, "size": 9, "ftype": "F32"}
            return httpx.Response(200, json={"data": [{"id": "tiny", "owned_by": "llamacpp", "meta": meta}]})
        seen.append(json.loads(request.content))
        message = {"content": "allow", "reasoning_content": "ok"}
        usage = {"prompt_tokens": 40, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}}
        return httpx.Response(
            200, json={"choices": [{"message": message, "finish_reason": "stop"}], "usage": usage}
        )

    return httpx.MockTransport(handle)


async def test_a_client_detects_llamacpp_and_speaks_its_terms() -> None:
    seen: list[dict[str, Any]] = []
    client = EngineClient(
        "http://llama", connect_timeout_s=1, first_token_timeout_s=5, total_timeout_s=5, connect_retries=0,
        max_connections=2, transport=llamacpp_handler(seen),
    )  # fmt: skip
    answer = await client.chat(gateway_body(), "req-1")
    assert client.kind == "llamacpp"
    assert client.slots == 3
    assert client.vision is True
    assert "grammar" in seen[0]
    assert "structured_outputs" not in seen[0]
    assert (answer.content, answer.reasoning) == ("allow", "ok")
    assert (answer.usage.prompt_tokens, answer.usage.cached_tokens) == (40, 32)
    assert await client.model_cards() == [("tiny", "llamacpp:7:9:F32")]  # the reuse scope names the kind
    await client.aclose()


async def test_a_client_told_its_kind_asks_nothing_to_detect_it() -> None:
    paths: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        choice = {"message": {"content": "allow"}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice]})

    client = EngineClient(
        "http://v", connect_timeout_s=1, first_token_timeout_s=5, total_timeout_s=5, connect_retries=0,
        max_connections=2, transport=httpx.MockTransport(handle), kind="vllm",
    )  # fmt: skip
    await client.chat(gateway_body(), "req-2")
    assert paths == ["/v1/chat/completions"]
    assert re.fullmatch(r"vllm", client.kind)
    await client.aclose()


@pytest.mark.parametrize(("kind", "timed"), [("llamacpp", True), ("vllm", False)])
async def test_the_first_token_is_llamacpps_role_chunk_even_when_it_writes_nothing(
    kind: str, timed: bool
) -> None:
    """llama-server sends its role chunk with the first generated token (a blank of the thought changes no
    field, so nothing else may come for a while); vLLM sends its role chunk before any token."""
    chunks = [{"delta": {"role": "assistant", "content": None}}, {"delta": {}, "finish_reason": "length"}]
    stream = "".join(f"data: {json.dumps({'choices': [c]})}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=stream, headers={"content-type": "text/event-stream"})

    client = EngineClient(
        "http://e", connect_timeout_s=1, first_token_timeout_s=5, total_timeout_s=5, connect_retries=0,
        max_connections=2, transport=httpx.MockTransport(handle), kind=kind,
    )  # fmt: skip
    answer = await client.chat(gateway_body(stream=True), "req-3")
    assert (answer.ttft_s is not None) is timed
    await client.aclose()


async def test_a_client_told_llamacpp_reads_its_slots_and_reads_them_again_after_a_failed_call() -> None:
    slots = {"total": 3}
    paths: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": slots["total"], "modalities": {"vision": True}})
        if slots["total"] == 0:
            return httpx.Response(503, json={"error": {"code": 503, "message": "Loading model"}})
        choice = {"message": {"content": "allow"}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice]})

    client = EngineClient(
        "http://llama", connect_timeout_s=1, first_token_timeout_s=5, total_timeout_s=5, connect_retries=0,
        max_connections=2, transport=httpx.MockTransport(handle), kind="llamacpp", props_recheck_s=3600,
    )  # fmt: skip
    await client.chat(gateway_body(), "req-4")
    await client.chat(gateway_body(), "req-5")
    assert (client.slots, paths.count("/props")) == (3, 1)  # told the kind, still asked for its slots once
    slots["total"] = 0  # restarting: its calls answer 503
    with pytest.raises(EngineUnavailable):
        await client.chat(gateway_body(), "req-6")
    slots["total"] = 2  # back with --parallel 2
    await client.chat(gateway_body(), "req-7")
    assert (client.slots, paths.count("/props")) == (2, 2)  # read again on the call after the failure
    await client.aclose()


def test_a_third_engine_kind_is_one_registered_wire_that_the_client_detects_from_its_props() -> None:
    class ToyWire(EngineWire):
        kind: ClassVar[str] = "toy"
        busy_answers: ClassVar[tuple[str, ...]] = ("toy is full",)

        @classmethod
        def claims_props(cls, status: int, payload: object) -> bool:
            return status == 200 and isinstance(payload, dict) and payload.get("engine") == "toy"

    def toy_engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"engine": "toy"})
        return httpx.Response(404)

    async def detected() -> str:
        async with EngineClient(
            "http://toy.test", connect_timeout_s=1.0, first_token_timeout_s=1.0, total_timeout_s=1.0,
            connect_retries=0, max_connections=1, transport=httpx.MockTransport(toy_engine),
        ) as client:
            return (await client.wire()).kind

    register(ToyWire())
    try:
        assert kind_from_props(200, {"engine": "toy"}) == "toy"
        assert asyncio.run(detected()) == "toy"
        assert wire_for("vllm").says_busy(503, "toy is full")  # every kind's busy answers, as for a pool
    finally:
        del WIRES["toy"]
    assert kind_from_props(200, {"engine": "toy"}) == "vllm"
