"""llama.cpp's verdict-place probe (gateway/moderation/engine_call.py ``verdict_places``): asked only where
the answer's own list cannot give an exact confidence, each retry with another seed, at most the setting's
calls."""

from __future__ import annotations

import json
import math

import httpx

from gateway.engine.answers import EngineAnswer
from gateway.engine.client import EngineClient, Usage
from gateway.moderation.engine_call import Places, verdict_places
from gateway.policy.rules import ThinkingDecision
from shaping.confidence import TokenLogprob
from shaping.verdict import compact_regex

# after llama.cpp's chain: seed 0's first draw was one the grammar admits (the raw softmax, mass left out);
# seed 1's was forbidden, so it drew again under the grammar (only admitted tokens, summing to 1)
RAW_DRAW = [("\n", 0.5), ("review", 0.2), ("The", 0.1)]
GRAMMAR_DRAW = [("review", 0.8), ("allow", 0.15), ("block", 0.05)]
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "frame"}], "max_completion_tokens": 8,
        "chat_template_kwargs": {"enable_thinking": False}, "logprobs": True, "top_logprobs": 5,
        "structured_outputs": {"regex": compact_regex(1)}}
OFF = ThinkingDecision(mode="off", rule="caller", max_completion_tokens=8, thinking_token_budget=None,
                       policy_version=1)


def fake_llamacpp(seeds: list[int]) -> httpx.MockTransport:
    """A llama-server that answers probes by seed (and records each seed it was sent)."""
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seeds.append(body["seed"])
        place = RAW_DRAW if body["seed"] == 0 else GRAMMAR_DRAW
        entry = {"token": place[0][0], "prob": place[0][1],
                 "top_probs": [{"token": t, "prob": p} for t, p in place]}
        usage = {"prompt_tokens": 120, "completion_tokens": 1, "total_tokens": 121}
        return httpx.Response(200, json={"choices": [{"logprobs": {"content": [entry]}}], "usage": usage})

    return httpx.MockTransport(handle)


def tiny_models_answer() -> EngineAnswer:
    """``review`` with the raw softmax giving every admitted token 0 in float (the tiny model's)."""
    entry = TokenLogprob("review", float("-inf"), ((" " * 8, 0.0), ("review", -math.inf)))
    return EngineAnswer(content="review", reasoning=None, finish_reason="stop", usage=Usage(), ttft_s=0.1,
                        total_s=0.2, request_id="r", streamed=True, logprobs=(entry,),
                        logprobs_grammar_masked=False)


async def places_with(probes: int) -> tuple[Places, list[int]]:
    seeds: list[int] = []
    client = EngineClient("http://engine.test", connect_timeout_s=5, first_token_timeout_s=30,
                          total_timeout_s=60, connect_retries=0, max_connections=4,
                          transport=fake_llamacpp(seeds), kind="llamacpp")
    try:
        places = await verdict_places(client, BODY, tiny_models_answer(), OFF, 1,
                                      grammar=compact_regex(1), probes=probes)
    finally:
        await client.aclose()
    return places, seeds


async def test_a_probe_that_reads_no_exact_list_is_drawn_again_with_another_seed() -> None:
    places, seeds = await places_with(probes=3)
    assert seeds == [0, 1]  # the second seed's draw gave the grammar's list: no third call
    assert places.found == {0: tuple(GRAMMAR_DRAW)}


async def test_the_probes_a_verdict_may_cost_are_bounded_by_the_setting() -> None:
    assert await places_with(probes=1) == (Places({}, 1, 120, 1), [0])  # its raw list not exact: none
    assert await places_with(probes=0) == (Places(), [])


async def test_what_the_probes_cost_is_counted_for_the_tenants_charge() -> None:
    places, _ = await places_with(probes=3)
    assert (places.calls, places.prompt_tokens, places.completion_tokens) == (2, 240, 2)
