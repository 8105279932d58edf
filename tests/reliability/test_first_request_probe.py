"""The first-request probe: an engine that is healthy but fails its first request is not ready, and says why.

The fake engines answer as the real vLLM CPU build did serving a hybrid (Gated DeltaNet) model in float32:
``/health`` 200, ``/metrics`` with a mamba cache mode, and the first chat request 500 with vLLM's message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar.testing import AsyncTestClient

from gateway.engine.first_request import HYBRID_ON_CPU_NEEDS_BF16
from gateway.http.app import create_app
from gateway.settings import Settings

VLLM_ENGINE_CORE_500 = {
    "error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError", "param": None, "code": 500,
    }
}  # fmt: skip
HYBRID_CACHE_INFO = (
    '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="1152",engine="0",'
    'mamba_cache_mode="align",mamba_block_size="16",prefix_match_unit="None"} 1.0\n'
)
PLAIN_CACHE_INFO = (
    '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",engine="0",'
    'mamba_cache_mode="none",mamba_block_size="None",prefix_match_unit="None"} 1.0\n'
)
VERDICT = {
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": '{"verdict":"allow"}'}}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 1},
}  # fmt: skip


class FakeVllm:
    """A vLLM-shaped engine: healthy, its metrics as given, and its chat answers from ``chat``; ``dtype``: the
    weights' dtype its ``/server_info`` says (vLLM with VLLM_SERVER_DEV_MODE=1), None: no such route."""

    def __init__(
        self, metrics: str, chat: Callable[[], httpx.Response], dtype: str | None = "float32"
    ) -> None:
        self.metrics = metrics
        self.chat = chat
        self.dtype = dtype
        self.chats: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/props":  # vLLM serves none: that is how the gateway tells it from llama.cpp
            return httpx.Response(404)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "root": "/models/tiny"}]})
        if path == "/metrics":
            return httpx.Response(200, text=self.metrics)
        if path == "/server_info" and self.dtype is not None:  # vLLM's JSON form: torch dtypes as str()
            config = {"model_config": {"model": "/models/tiny", "dtype": f"torch.{self.dtype}"}}
            return httpx.Response(200, json={"vllm_config": config, "vllm_env": {}, "system_env": {}})
        if path == "/tokenize":
            return httpx.Response(200, json={"count": 400, "max_model_len": 8192, "tokens": []})
        if path == "/v1/chat/completions":
            self.chats.append(json.loads(request.content))
            return self.chat()
        return httpx.Response(404)


@asynccontextmanager
async def gateway(engine: FakeVllm) -> AsyncIterator[AsyncTestClient[Any]]:
    """The app in front of ``engine``."""
    app = create_app(Settings(engine={"model": "auto"}), engine_transport=httpx.MockTransport(engine))
    async with AsyncTestClient(app, timeout=30) as client:
        yield client


async def test_a_hybrid_engine_that_fails_its_first_request_is_not_ready_and_names_bfloat16() -> None:
    engine = FakeVllm(HYBRID_CACHE_INFO, lambda: httpx.Response(500, json=VLLM_ENGINE_CORE_500))
    async with gateway(engine) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    (entry,) = ready.json()["engines"]
    assert entry["up"] is False
    assert entry["first_request"]["status"] == "failed"
    detail = entry["first_request"]["detail"]
    assert detail.startswith("the engine failed its first request (engine answered 500: EngineCore")
    assert detail.endswith(HYBRID_ON_CPU_NEEDS_BF16)
    assert "--dtype bfloat16" in detail
    # The probe is a real, tiny request to the served model.
    (probe,) = engine.chats
    assert probe["model"] == "tiny"
    assert probe["max_tokens"] == 1
    assert probe["chat_template_kwargs"] == {"enable_thinking": False}


async def failure_detail(engine: FakeVllm) -> str:
    async with gateway(engine) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    (entry,) = ready.json()["engines"]
    assert entry["first_request"]["status"] == "failed"
    detail: str = entry["first_request"]["detail"]
    assert detail.startswith("the engine failed its first request (engine answered 500: EngineCore")
    return detail


async def test_a_bfloat16_hybrid_engine_that_fails_its_first_request_is_not_told_to_leave_float32() -> None:
    engine = FakeVllm(HYBRID_CACHE_INFO, lambda: httpx.Response(500, json=VLLM_ENGINE_CORE_500),
                      dtype="bfloat16")
    detail = await failure_detail(engine)
    assert "float32" not in detail
    assert "bfloat16" in detail  # the dtype it reported, so the reader looks elsewhere (the engine's log)


async def test_a_hybrid_engine_whose_dtype_cannot_be_read_is_not_said_to_be_float32() -> None:
    engine = FakeVllm(HYBRID_CACHE_INFO, lambda: httpx.Response(500, json=VLLM_ENGINE_CORE_500), dtype=None)
    detail = await failure_detail(engine)
    assert "float32" not in detail
    assert "VLLM_SERVER_DEV_MODE=1" in detail  # how to let the gateway read it


async def test_the_probe_is_sent_once_and_its_failure_is_remembered() -> None:
    engine = FakeVllm(HYBRID_CACHE_INFO, lambda: httpx.Response(500, json=VLLM_ENGINE_CORE_500))
    async with gateway(engine) as client:
        first = await client.get("/readyz")
        second = await client.get("/readyz")
    assert first.status_code == second.status_code == 503
    assert second.json()["engines"][0]["first_request"] == first.json()["engines"][0]["first_request"]
    assert len(engine.chats) == 1


async def test_an_engine_without_linear_attention_is_trusted_to_its_health() -> None:
    engine = FakeVllm(PLAIN_CACHE_INFO, lambda: httpx.Response(500, json=VLLM_ENGINE_CORE_500))
    async with gateway(engine) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert engine.chats == []  # no extra request at every start for the engines that do not need it


async def test_an_engine_that_answers_its_first_request_is_ready() -> None:
    engine = FakeVllm(HYBRID_CACHE_INFO, lambda: httpx.Response(200, json=VERDICT))
    async with gateway(engine) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["engines"][0]["up"] is True
    assert "first_request" not in ready.json()["engines"][0]
    assert len(engine.chats) == 1
