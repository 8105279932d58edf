"""A llama.cpp verdict-place probe runs the model in its call's engine slot, so its tokens are the tenant's
work in the fair share: through the whole gateway, the tenant is charged the verdict's usage and the
probe's. The engine is a fake llama-server (httpx.MockTransport in place of the client's transport): the
simulator's llama.cpp lists always read exact, so it is never probed."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

import gateway.engine.client as engine_client
from deploy.keyframes import make_keyframe
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.support import image_input

WEIGHT = 4.0  # MODGATE_TENANTS__OUTPUT_TOKEN_WEIGHT: set, so never learned
VERDICT_USAGE = {"prompt_tokens": 500, "completion_tokens": 1, "total_tokens": 501}
PROBE_USAGE = {"prompt_tokens": 120, "completion_tokens": 1, "total_tokens": 121}
# the answer's own list: the raw softmax, mass left off the list, so no exact confidence (a probe is asked)
RAW = [("\n", 0.5), ("review", 0.2), ("The", 0.1)]
# the probe's list after llama.cpp's chain: the grammar's distribution, which reads exact
PLACE = [("review", 0.8), ("allow", 0.15), ("block", 0.05)]


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def fake_llama_server(probes: list[dict[str, Any]]) -> httpx.MockTransport:
    """llama-server's routes as the gateway reads them; a probe (``post_sampling_probs``) is recorded."""
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/props":
            return httpx.Response(200, json={"total_slots": 4, "modalities": {"vision": True},
                                             "default_generation_settings": {"params": {}}})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "owned_by": "llamacpp"}]})
        if path != "/v1/chat/completions":
            return httpx.Response(200, text="" if path == "/metrics" else "{}")
        body = json.loads(request.content)
        if body.get("post_sampling_probs"):
            probes.append(body)
            entry = {"token": PLACE[0][0], "prob": PLACE[0][1],
                     "top_probs": [{"token": t, "prob": p} for t, p in PLACE]}
            return httpx.Response(200, json={"choices": [{"index": 0, "logprobs": {"content": [entry]},
                                                          "finish_reason": "length"}], "usage": PROBE_USAGE})
        entry = {"token": "review", "logprob": math.log(0.2),
                 "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in RAW]}
        stream = sse(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "review"},
                          "logprobs": {"content": [entry]}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": VERDICT_USAGE},
        )
        return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


def tenant_work(text: str, tenant: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "modgate_tenant_engine_work":
            return sum(s.value for s in family.samples if s.labels.get("tenant") == tenant)
    return 0.0


@pytest.mark.parametrize("place_probes", [0, 2])
async def test_a_probes_tokens_are_charged_to_its_tenants_fair_share(
    monkeypatch: pytest.MonkeyPatch, place_probes: int
) -> None:
    probes: list[dict[str, Any]] = []
    monkeypatch.setattr(engine_client, "EngineTransport", lambda _limits: fake_llama_server(probes))
    settings = Settings.model_validate({
        "engine": {"url": "http://llama.test", "kind": "llamacpp", "startup_check": False,
                   "place_probes": place_probes},
        "shaping": {"verdict_cache_ttl_s": 0, "prefix_strategy": "off"},
        "tenants": {"output_token_weight": WEIGHT}, "auth": {"api_keys": "key-news:news"},
    })
    async with AsyncTestClient(create_app(settings), timeout=60) as client:
        answer = await client.post(
            "/v1/moderations", json={"input": image_input(make_keyframe("review", 320, 180, seed=3))},
            headers={"Authorization": "Bearer key-news", "X-Modgate-Thinking": "off"},
        )
        assert answer.status_code == 200, answer.text
        charged = tenant_work((await client.get("/metrics")).text, "news")
    verdict = VERDICT_USAGE["prompt_tokens"] + WEIGHT * VERDICT_USAGE["completion_tokens"]
    probe = PROBE_USAGE["prompt_tokens"] + WEIGHT * PROBE_USAGE["completion_tokens"]
    assert len(probes) == min(place_probes, 1)  # one probe read the exact list
    assert charged == verdict + probe * len(probes)
