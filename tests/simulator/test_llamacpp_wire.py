"""The simulator in llama-server's wire: what it takes, how it answers, and the gateway in front of it.

tests/contract holds it to the real llama-server beside the real one; here what the contract cannot reach
with the tiny real model is pinned: the grammar held from the first token, a server still loading, one
without a vision projector, a prompt over a slot's context, and the gateway reading a confidence from
its raw softmax as it reads vLLM's masked one.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.embedded import ThreadedServer
from cli.main import app as modgate_app
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from deploy.simulator.grammar import grammar_regex
from deploy.simulator.llamacpp_law import LlamaCppOptions
from deploy.simulator.llamacpp_responses import forbidden_beside
from gateway.engine.wires.gbnf import regex_to_gbnf
from gateway.engine.wires.llamacpp import THOUGHT_RULES
from shaping.verdict import compact_regex, verdict_regex
from tests.support import GatewayFactory, SimFactory, data_url, image_input

HI = [{"role": "user", "content": "hi"}]
COMPACT = regex_to_gbnf(compact_regex())
THINKING_COMPACT = THOUGHT_RULES + COMPACT.replace("root ::= ", "verdict ::= ", 1)


def llamacpp_sim(start_sim: SimFactory, **options: Any) -> str:
    return start_sim(kind="llamacpp", llamacpp=LlamaCppOptions(**options)).url


def chat(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": HI, **body}, timeout=30)


def frame_messages(seed: int = 3, label: str = "block:violence") -> list[dict[str, Any]]:
    image = {"type": "image_url", "image_url": {"url": data_url(make_keyframe(label, 640, 360, seed=seed))}}
    return [{"role": "user", "content": [image, {"type": "text", "text": "审核"}]}]


def test_a_gbnf_grammar_translates_to_the_regex_of_what_it_admits() -> None:
    compact = grammar_regex(COMPACT)
    assert compact.fullmatch("block:violence,hate")
    assert not compact.fullmatch("block:")
    json_verdict = grammar_regex(regex_to_gbnf(verdict_regex()))
    assert json_verdict.fullmatch('{"verdict":"allow","categories":[],"confidence":0.93}')
    thought = grammar_regex(THINKING_COMPACT)
    assert thought.fullmatch("画面中</think>\n\nallow")
    assert not thought.fullmatch("allow")  # the thought rule: the close of the think block comes first
    spanning = 'root ::= a "-" [x-z]{2,}  # a comment\na ::= ("b" |\n  "c")+\n'
    assert grammar_regex(spanning).fullmatch("bcb-xyz")


@pytest.mark.parametrize(
    ("grammar", "named"),
    [('root ::= "a" root?', "recursive"), ("root ::= other", "undefined"), ('x ::= "a"', "root")],
)
def test_a_grammar_the_simulator_cannot_check_is_a_400_without_param(
    start_sim: SimFactory, grammar: str, named: str
) -> None:
    response = chat(llamacpp_sim(start_sim), grammar=grammar)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"code", "message", "type"}
    assert error["type"] == "invalid_request_error"
    assert named in error["message"]


def test_the_grammar_holds_the_whole_output_from_the_first_token(start_sim: SimFactory) -> None:
    url = llamacpp_sim(start_sim)
    thinking_on = {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_budget_tokens": 6}
    # a grammar with room for the thought: reasoning first, then the verdict after </think>
    message = chat(url, messages=frame_messages(), grammar=THINKING_COMPACT, **thinking_on).json()
    assert message["choices"][0]["message"]["reasoning_content"]
    assert re.fullmatch(compact_regex(), message["choices"][0]["message"]["content"])
    # the verdict's grammar alone: the first token is the verdict's, so no thought is written at all
    held = chat(url, messages=frame_messages(), grammar=COMPACT, **thinking_on).json()["choices"][0]
    assert "reasoning_content" not in held["message"]
    assert re.fullmatch(compact_regex(), held["message"]["content"])


def test_a_loading_server_answers_503_on_every_route_until_it_is_loaded() -> None:
    app = create_sim_app(PRESETS["instant"], 0.0, kind="llamacpp", loading_s=3.0)
    with ThreadedServer(app) as server:
        early = [httpx.get(f"{server.url}{path}", timeout=30) for path in ("/health", "/props", "/v1/models")]
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/health", timeout=30).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        ready = httpx.get(f"{server.url}/health", timeout=30)
    loading = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
    for response in early:
        assert response.status_code == 503
        assert response.json() == loading
    assert ready.json() == {"status": "ok"}


def test_a_prompt_over_one_slots_context_is_refused_with_both_counts(start_sim: SimFactory) -> None:
    url = llamacpp_sim(start_sim, n_parallel=4, n_ctx=2048)  # 512 tokens a slot
    response = chat(url, messages=[{"role": "user", "content": "违规 " * 600}])
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == 512
    assert error["n_prompt_tokens"] > 512
    assert "exceeds the available context size" in error["message"]


def test_tokenize_counts_the_rendered_template_as_the_chat_counts_its_prompt(start_sim: SimFactory) -> None:
    url = llamacpp_sim(start_sim)
    body = {"messages": [{"role": "system", "content": "审核员"}, *HI]}
    prompt = httpx.post(f"{url}/apply-template", json=body, timeout=30).json()["prompt"]
    tokens = httpx.post(f"{url}/tokenize", json={"content": prompt}, timeout=30).json()["tokens"]
    answered = chat(url, **body, max_tokens=2).json()
    assert len(tokens) == answered["usage"]["prompt_tokens"]
    back = httpx.post(f"{url}/detokenize", json={"tokens": tokens}, timeout=30).json()["content"]
    assert back == prompt
    pieces = httpx.post(f"{url}/tokenize", json={"content": "hi", "with_pieces": True}, timeout=30).json()
    assert [piece["piece"] for piece in pieces["tokens"]] == ["hi"]


def test_the_gateway_detects_the_simulated_llamacpp_and_caps_it_at_its_slots(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    url = llamacpp_sim(start_sim, n_parallel=3, n_ctx=3 * 4096)
    gateway = start_gateway(engine={"url": url, "max_inflight": 32})
    ready = httpx.get(f"{gateway.url}/readyz", timeout=30).json()
    (engine,) = ready["engines"]
    assert (engine["kind"], engine["cap"]) == ("llamacpp", 3)
    assert ready["model"]["root"].startswith("llamacpp:")


def moderate_keyframe(
    gateway_url: str, label: str, width: int, height: int, seed: int, **headers: str
) -> httpx.Response:
    """One synthetic keyframe through the gateway's /v1/moderations."""
    return httpx.post(
        f"{gateway_url}/v1/moderations",
        json={"input": image_input(make_keyframe(label, width, height, seed=seed))},
        headers=headers,
        timeout=60,
    )


THINKING_OFF = {"X-Modgate-Thinking": "off"}


def test_the_gateway_reads_the_same_confidence_from_either_wire(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    """vLLM's logprobs are grammar-masked; llama.cpp's are a raw softmax with the twins the grammar forbids
    (`` allow``, ``Allow``, ``allowed``) listed beside the action: read over what the verdict's regex admits,
    the same simulated model gives the same confidence on both wires, exactly (no lower bound)."""
    readings = []
    for url in (start_sim().url, llamacpp_sim(start_sim)):
        gateway = start_gateway(engine={"url": url})
        response = moderate_keyframe(gateway.url, "allow", 640, 360, 5, **THINKING_OFF)
        assert response.status_code == 200, response.text
        details = response.json()["results"][0]["modgate"]
        readings.append((details["action"], details["confidence"], details["confidence_reason"]))
    (vllm_action, vllm_confidence, _), (llamacpp_action, llamacpp_confidence, reason) = readings
    assert vllm_action == llamacpp_action
    assert vllm_confidence is not None
    assert llamacpp_confidence is not None, reason
    assert forbidden_beside("allow", set())  # the raw list did hold twins the grammar forbids
    assert llamacpp_confidence == pytest.approx(vllm_confidence, abs=2e-4)


def test_an_image_to_a_simulated_llamacpp_without_a_vision_projector_says_mmproj(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    url = start_sim(kind="llamacpp", vision=False).url
    refused = chat(url, messages=frame_messages())
    assert refused.status_code == 500  # a runtime_error in llama-server's parser: its server_error
    assert refused.json()["error"]["type"] == "server_error"
    assert httpx.get(f"{url}/props", timeout=30).json()["modalities"]["vision"] is False
    gateway = start_gateway(engine={"url": url})
    response = moderate_keyframe(gateway.url, "allow", 320, 180, 2)
    assert 400 <= response.status_code < 600
    assert response.status_code != 500
    assert "--mmproj" in response.json()["error"]["message"]


def test_a_keyframe_over_one_slots_context_comes_back_through_the_gateway_saying_what_to_change(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    url = llamacpp_sim(start_sim, n_parallel=4, n_ctx=2048)  # 512 tokens a slot: a keyframe needs ~1,000
    gateway = start_gateway(engine={"url": url})
    response = moderate_keyframe(gateway.url, "allow", 640, 360, 4, **THINKING_OFF)
    assert 400 <= response.status_code < 600, response.text
    assert response.status_code != 500
    error = response.json()["error"]
    assert {"message", "type", "code"} <= set(error)  # the OpenAI error shape, not a verdict of review
    assert "exceeds the available context size" in error["message"]
    assert "-c divided by --parallel" in error["message"]  # what to change


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "sglang"], "unknown kind 'sglang'; choose vllm or llamacpp"),
        (["--kind", "vllm", "--slots", "2"], "--slots, --ctx-size and --loading-s are llama-server's"),
    ],
    ids=["unknown-kind", "llamacpp-flag-on-vllm"],
)
def test_engine_sim_refuses_a_kind_it_does_not_speak_before_serving(args: list[str], message: str) -> None:
    result = CliRunner().invoke(modgate_app, ["engine-sim", "--host", "256.0.0.1", *args], terminal_width=200)
    # a usage error before anything is served (the host cannot be bound either, should the check go)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())
