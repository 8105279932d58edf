"""The engine request's body is compact UTF-8 JSON, byte for byte what ``json.dumps`` writes (orjson writes
it: the keyframe's base64 is most of it)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from deploy.keyframes import make_keyframe
from gateway.engine.client import EngineClient
from gateway.errors import ServerSideError


async def test_the_body_sent_is_compact_utf8_json_of_the_request() -> None:
    sent: list[bytes] = []

    def engine(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(503, json={"error": {"message": "recorded"}})

    client = EngineClient("http://engine", connect_timeout_s=1, first_token_timeout_s=5, total_timeout_s=5,
                          connect_retries=0, max_connections=1, transport=httpx.MockTransport(engine),
                          kind="vllm")
    url = "data:image/jpeg;base64," + base64.b64encode(make_keyframe("allow", 320, 192, seed=1)).decode()
    body: dict[str, Any] = {
        "model": "m", "stream": True, "max_tokens": 8, "temperature": 0.0, "top_logprobs": 10,
        "messages": [{"role": "system", "content": "Modération: «violence» — 暴力 \u2028 \"quoted\" \\ \n"},
                     {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        "structured_outputs": {"regex": "(allow|review|block)\\|[a-z_,]*"},
    }
    with pytest.raises(ServerSideError):
        await client.chat(body, "req-1")
    await client.aclose()
    assert sent == [json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()]
