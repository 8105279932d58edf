"""The engine contract on a hybrid model (Gated DeltaNet beside full attention), as the production one is.

Columns: ``[simulator]`` (vLLM's wire, with the hybrid engine's 2,176-token block), ``[vllm]`` (the real vLLM
CPU build serving ``modgate engine-cpu --model hybrid``, booted once per session with a match unit of 16),
``[simulator-llamacpp]`` (llama.cpp's law for a recurrent model) and ``[llamacpp]`` (the real llama-server
on the same weights as GGUF). The requests are the gateway's text moderations: the shared system prompt,
then the text as the user turn; the model has no vision tower, so images stay on the vision model's suite.

The engine is shared by the session, and a primed shared prefix stays in its cache, so each test that looks
at cached tokens tags the end of the system prompt with its own nonce: no other test's request (or primer)
reaches its prefix.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.simulator.llamacpp_law import LlamaCppOptions
from gateway.engine.wires import EngineKind, wire_for
from gateway.settings import ShapingSettings
from shaping.prompt import RequestOptions, SystemPrompt, build_chat_request, load_system_prompt
from shaping.verdict import verdict_regex
from tests.contract.conftest import HYBRID_MATCH_UNIT
from tests.support import SimFactory

# What vLLM's CPU backend sets for the tiny hybrid with a float32 SSM state (deploy/tiny_hybrid/build.py).
HYBRID_BLOCK = 2176
LLAMACPP_COLUMNS = ("simulator-llamacpp", "llamacpp")
# The real llama-server as modgate engine-llamacpp starts it (4 slots of 4,096), on a recurrent model.
SIM_LLAMACPP = LlamaCppOptions(n_parallel=4, n_ctx=4 * 4096, recurrent=True)


@dataclass(frozen=True)
class Engine:
    """A hybrid engine under contract."""

    kind: str
    url: str
    model: str

    @property
    def llamacpp(self) -> bool:
        return self.kind in LLAMACPP_COLUMNS

    @property
    def wire_kind(self) -> EngineKind:
        return "llamacpp" if self.llamacpp else "vllm"

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        sent = wire_for(self.wire_kind).chat_body(body)
        response = httpx.post(f"{self.url}/v1/chat/completions", json=sent, timeout=300)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


VLLM_PARAMS = ["simulator", pytest.param("vllm", marks=pytest.mark.vllm)]
LLAMACPP_PARAMS = ["simulator-llamacpp", pytest.param("llamacpp", marks=pytest.mark.llamacpp)]


@pytest.fixture(params=[*VLLM_PARAMS, *LLAMACPP_PARAMS])
def engine(request: pytest.FixtureRequest, start_sim: SimFactory) -> Engine:
    """Every column."""
    return column_engine(request, start_sim, str(request.param))


@pytest.fixture(params=VLLM_PARAMS)
def vllm_engine(request: pytest.FixtureRequest, start_sim: SimFactory) -> Engine:
    """vLLM's columns: the simulator with the hybrid's block, and the real engine."""
    return column_engine(request, start_sim, str(request.param))


@pytest.fixture(params=LLAMACPP_PARAMS)
def llamacpp_engine(request: pytest.FixtureRequest, start_sim: SimFactory) -> Engine:
    """llama.cpp's columns: the simulator's law for a recurrent model, and the real server."""
    return column_engine(request, start_sim, str(request.param))


def column_engine(request: pytest.FixtureRequest, start_sim: SimFactory, column: str) -> Engine:
    """One column's engine: a simulator started for the test, or the session's real hybrid engine."""
    if column == "simulator":
        url = start_sim("instant", time_scale=0.0, block_size=HYBRID_BLOCK).url
    elif column == "simulator-llamacpp":
        url = start_sim("instant", time_scale=0.0, kind="llamacpp", llamacpp=SIM_LLAMACPP).url
    else:
        fixture = "real_hybrid_llamacpp_url" if column == "llamacpp" else "real_hybrid_url"
        url = str(request.getfixturevalue(fixture))
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    return Engine(column, url, model)


def tagged_prompt() -> SystemPrompt:
    """The canonical system prompt after a nonce line: a prefix no other test's request shares, not even the
    canonical prompt's own tokens the gateway primed (a nonce at the end left those 320 tokens hitting)."""
    canonical = load_system_prompt()
    return SystemPrompt(version=canonical.version, text=f"{uuid.uuid4().hex}\n{canonical.text}")


def text_request(
    engine: Engine,
    text: str,
    *,
    system: SystemPrompt | None = None,
    thinking: bool = False,
    max_tokens: int = 8,
    constraint: str = "regex",
) -> dict[str, Any]:
    """The gateway's own engine request for a text moderation (no image)."""
    return build_chat_request(
        system or load_system_prompt(),
        [],
        ShapingSettings().text_user_text.format(text=text),
        RequestOptions(
            model=engine.model,
            enable_thinking=thinking,
            max_completion_tokens=max_tokens,
            constraint=constraint,
            stream=False,
        ),
    )


def cached(answer: dict[str, Any]) -> int:
    return int((answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def cache_config(url: str) -> dict[str, str]:
    """The labels of the engine's ``vllm:cache_config_info``: what the gateway reads of its cache."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if family.name == "vllm:cache_config_info":
            return dict(family.samples[0].labels)
    raise AssertionError("the engine does not report vllm:cache_config_info")


# --- verdict, thinking, usage ---------------------------------------------------------------------------


def test_a_text_moderation_comes_back_under_the_verdict_grammar(engine: Engine) -> None:
    answer = engine.post(text_request(engine, "今天天气很好。", max_tokens=128))
    choice = answer["choices"][0]
    content = choice["message"]["content"]
    if choice["finish_reason"] == "stop":
        assert re.fullmatch(verdict_regex(), content), content
    else:  # cut by max tokens: what came is still a prefix the constraint allowed
        assert content.startswith('{"verdict":"'), content


def test_the_json_schema_verdict_constraint_is_honoured_on_text(engine: Engine) -> None:
    answer = engine.post(text_request(engine, "今天天气很好。", max_tokens=128, constraint="json_schema"))
    choice = answer["choices"][0]
    content = choice["message"]["content"] or ""
    if choice["finish_reason"] == "stop":
        assert json.loads(content)["verdict"] in ("allow", "review", "block")
    else:
        assert content.lstrip().startswith("{"), content


def test_thinking_off_gives_no_reasoning_on_text(engine: Engine) -> None:
    answer = engine.post(text_request(engine, "一段普通的文字。", thinking=False))
    message = answer["choices"][0]["message"]
    assert not message.get("reasoning")
    assert not message.get("reasoning_content")
    if not engine.llamacpp:
        assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_thinking_on_opens_the_thought_in_the_prompt(engine: Engine) -> None:
    """Thinking on: the template opens ``<think>`` in the prompt, so the prompt is the one without the empty
    think block, and vLLM counts what the model writes as reasoning."""
    off = engine.post(text_request(engine, "一段普通的文字。", thinking=False))
    on = engine.post(text_request(engine, "一段普通的文字。", thinking=True, max_tokens=16))
    # "<think>\n\n</think>\n\n" after the assistant header with thinking off, "<think>\n" with it on
    assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"]
    if not engine.llamacpp:
        details = on["usage"]["completion_tokens_details"]
        assert details["reasoning_tokens"] == on["usage"]["completion_tokens"] > 0
        assert on["choices"][0]["message"]["reasoning"]


def test_usage_counts_cached_tokens_and_no_image(engine: Engine) -> None:
    answer = engine.post(text_request(engine, "一段普通的文字。"))
    usage = answer["usage"]
    details = usage["prompt_tokens_details"]
    assert "cached_tokens" in details
    assert (details.get("multimodal_tokens") or {}).get("image", 0) == 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if engine.llamacpp:
        assert answer["timings"]["prompt_n"] + answer["timings"]["cache_n"] == usage["prompt_tokens"]


# --- the prefix cache: the seed's failure, and what fixes it ----------------------------------------------


def test_the_shared_prefix_is_never_cached_on_vllm_without_priming(vllm_engine: Engine) -> None:
    """The seed's failure: the shared prefix is shorter than one block, so requests with their own user turn
    cache nothing. An identical resend caches nothing either (the prompt is shorter than one block), unless
    the engine has a match unit: then the state kept at the prompt's last unit boundary is found again
    (410 prompt tokens: 400 cached), which a moderation, whose user turn is always new, never sends."""
    engine = vllm_engine
    config = cache_config(engine.url)
    assert int(config["block_size"]) == HYBRID_BLOCK
    unit = None if config.get("prefix_match_unit", "None") == "None" else int(config["prefix_match_unit"])
    system = tagged_prompt()
    users = [f"第{index}段文字：{uuid.uuid4().hex}" for index in range(3)]
    unique = [engine.post(text_request(engine, user, system=system)) for user in users]
    resend = text_request(engine, users[-1], system=system)
    resent = [engine.post(resend) for _ in range(3)]
    assert all(answer["usage"]["prompt_tokens"] < HYBRID_BLOCK for answer in [*unique, *resent])
    assert [cached(answer) for answer in unique] == [0, 0, 0]
    prompt = resent[0]["usage"]["prompt_tokens"]
    expected = 0 if unit is None else (prompt - 1) // unit * unit
    assert [cached(answer) for answer in resent] == [expected] * 3, (prompt, unit)


def test_llamacpp_reuses_the_shared_prefix_with_no_flag(llamacpp_engine: Engine) -> None:
    """llama.cpp keeps a checkpoint of the recurrent state where the last user turn starts: the next request
    with the same system prompt restores it (0, then the system turn on every later request)."""
    engine = llamacpp_engine
    system = tagged_prompt()
    answers = [
        engine.post(text_request(engine, f"第{index}段文字：{uuid.uuid4().hex}", system=system))
        for index in range(4)
    ]
    hits = [cached(answer) for answer in answers]
    assert hits[0] == 0
    assert len(set(hits[1:])) == 1, hits
    assert hits[1] > 300, hits  # the ~400-token system turn, not a few tokens
    assert all(hit < answer["usage"]["prompt_tokens"] for hit, answer in zip(hits, answers, strict=True))


def shared_prefix_ids(url: str, model: str, system: SystemPrompt) -> list[int]:
    """The token ids two text moderations under ``system`` share (vLLM's own /tokenize)."""
    ids = []
    for text in ("甲", "乙"):
        request = text_request(Engine("vllm", url, model), text, system=system)
        body = {
            "model": model,
            "messages": request["messages"],
            "add_generation_prompt": True,
            "chat_template_kwargs": request["chat_template_kwargs"],
        }
        response = httpx.post(f"{url}/tokenize", json=body, timeout=60)
        assert response.status_code == 200, response.text
        ids.append(response.json()["tokens"])
    first, second = ids
    common = 0
    while common < min(len(first), len(second)) and first[common] == second[common]:
        common += 1
    return list(first[:common])


@pytest.mark.vllm
def test_with_a_match_unit_one_primer_makes_the_shared_prefix_hit(real_hybrid_url: str) -> None:
    """``--prefix-match-unit 16``: unprimed, 0 cached; after ONE request whose prompt ends right after the
    shared prefix, every request caches the largest multiple of 16 before the primer's last token (a primer
    that ends on a unit's edge keeps its state one unit back: 352 of a 368-token prefix, seen in CI; the
    random nonce makes that one run in 16)."""
    model = httpx.get(f"{real_hybrid_url}/v1/models", timeout=30).json()["data"][0]["id"]
    engine = Engine("vllm", real_hybrid_url, model)
    system = tagged_prompt()
    shared = shared_prefix_ids(real_hybrid_url, model, system)
    assert len(shared) > 300  # the system turn and the user turn's header: a prefix worth caching
    unprimed = [engine.post(text_request(engine, uuid.uuid4().hex, system=system)) for _ in range(2)]
    primer = httpx.post(
        f"{real_hybrid_url}/v1/completions",
        json={"model": model, "prompt": shared, "max_tokens": 1},
        timeout=300,
    )
    assert primer.status_code == 200, primer.text
    primed = [engine.post(text_request(engine, uuid.uuid4().hex, system=system)) for _ in range(3)]
    expected = (len(shared) - 1) // HYBRID_MATCH_UNIT * HYBRID_MATCH_UNIT
    assert [cached(answer) for answer in unprimed] == [0, 0]
    assert [cached(answer) for answer in primed] == [expected] * 3, (len(shared), expected)
    assert cache_config(real_hybrid_url)["block_size"] == str(HYBRID_BLOCK)
