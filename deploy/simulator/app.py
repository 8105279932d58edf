"""The simulated engine's HTTP face: the slice of vLLM's OpenAI-compatible server the gateway uses.

Its verdicts come from the marker squares of synthetic keyframes (``deploy.keyframes``), so quality code has
ground truth; a configurable share of thinking-off answers differ, and each frame's difficulty sets both
that and the confidence its logprobs carry (``deploy.simulator.truth``; ``POST /sim/truth`` answers it for a
frame). It answers in the form the request's grammar holds it to (the compact verdict regex, the JSON
schema or regex, a choice) and returns logprobs in vLLM's shape when asked. Faults can be switched on for
tests (``POST /sim/faults``) or from the command line.

The routes are here; behind them, by job: ``protocol`` (the chat request, its images, errors in vLLM's shape),
``service`` (``SimulatedEngine``: the template, the ground truth, the planned output, faults), ``answers``
(the verdict text and its tokens' logprobs), ``responses`` (whole or streamed, with usage), and ``engine``
(the scheduler that times every step).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Final

from litestar import Litestar, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import State
from litestar.params import JSONBody
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field

from deploy.simulator.answers import END_OF_OUTPUT
from deploy.simulator.decisions import decision_prompt, is_decision, place_output, set_decision_answers
from deploy.simulator.engine import Sequence, TokenEvent
from deploy.simulator.llamacpp_law import LlamaCppOptions
from deploy.simulator.llamacpp_wire import LLAMACPP_ROUTES, LlamaCppServer, loading_guard
from deploy.simulator.llamacpp_wire import error_response as llamacpp_error_response
from deploy.simulator.presets import SimPreset
from deploy.simulator.protocol import ChatRequest, EngineError, decode_image, parse_chat, unless_caller_leaves
from deploy.simulator.responses import streamed, usage, whole
from deploy.simulator.service import Faults, SimulatedEngine
from deploy.simulator.tokenizer import Token, token_id
from gateway.engine.wires import EngineKind


class FaultsUpdate(BaseModel):
    """Body of ``POST /sim/faults``."""

    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(default=0.0, ge=0, le=1)
    slow_rate: float = Field(default=0.0, ge=0, le=1)
    slow_s: float = Field(default=5.0, ge=0)
    cut_stream_rate: float = Field(default=0.0, ge=0, le=1)
    malformed_rate: float = Field(default=0.0, ge=0, le=1)
    busy_rate: float = Field(default=0.0, ge=0, le=1)
    seed: int = 0


def _error_response(_: Request[Any, Any, Any], exc: EngineError) -> Response[dict[str, Any]]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}.get(
        exc.status_code, "BadRequestError"
    )
    return Response(
        {"error": {"message": exc.detail, "type": kind, "param": exc.param, "code": exc.status_code}},
        status_code=exc.status_code,
    )


QUEUE_FULL: Final = {
    "error": {
        "message": "The engine is currently busy and cannot accept new requests. "
                   "Please try again later or on a different instance.",
        "type": "Service Unavailable", "param": None, "code": 503,
    }
}  # fmt: skip
"""vLLM's ``QueueOverflowError`` answer past ``--max-num-queued-reqs`` (the ``busy_rate`` fault)."""


ENGINE_CORE_FAILED: Final = {
    "error": {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError", "param": None, "code": 500,
    }
}  # fmt: skip
"""The real vLLM's answer to a request its engine core died on (the float32 hybrid's first request)."""


def _engine_core_failed(state: State) -> Response[Any]:
    """vLLM's 500 for a dead engine core; then, as vLLM, the server exits (``on_exit``), else it stays up
    answering 500 with ``/health`` 503 (vLLM with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``)."""
    on_exit: Callable[[], None] | None = state.get("on_exit")
    return Response(ENGINE_CORE_FAILED, status_code=500,
                    background=None if on_exit is None else BackgroundTask(on_exit))


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    """OpenAI chat completions, streamed or not."""
    sim: SimulatedEngine = state.sim
    body = parse_chat(await request.body(), sim.preset.model)
    if sim.engine_core_dies():
        return _engine_core_failed(state)
    faults = sim.faults
    if sim.chance(faults.busy_rate):
        return Response(QUEUE_FULL, status_code=503)
    if sim.chance(faults.error_rate):
        raise EngineError(500, "simulated engine failure")
    if is_decision(body):
        return await _decision_place(request, sim, body)
    tokens, images, enable_thinking = sim.prompt_tokens(body)
    if len(tokens) >= sim.preset.max_model_len:
        raise EngineError(400, f"prompt is {len(tokens)} tokens, over max_model_len", "messages")
    # As vLLM: an X-Request-Id becomes the completion's id (prefixed), and the header is not echoed.
    request_id = f"chatcmpl-{request.headers.get('x-request-id') or uuid.uuid4().hex}"
    max_tokens = body.max_completion_tokens or body.max_tokens or sim.preset.max_model_len - len(tokens)
    sequence = Sequence(
        request_id=request_id,
        prompt=tokens,
        output=sim.plan_output(body, images, enable_thinking),
        max_tokens=max_tokens,
        priority=body.priority,
    )
    completion = sim.completion(sequence, images, body.logprobs, body.top_logprobs or 0)
    if body.stream:
        return streamed(sim.engine, completion, bool((body.stream_options or {}).get("include_usage")))
    return await unless_caller_leaves(request, whole(sim.engine, completion))


async def _decision_place(
    request: Request[Any, Any, Any], sim: SimulatedEngine, body: ChatRequest
) -> Response[Any]:
    """One place of a decision question's answer (deploy/simulator/decisions.py), answered whole."""
    tokens, images, question, before, thinks = decision_prompt(body, sim.bpe, sim.grid)
    if len(tokens) >= sim.preset.max_model_len:
        raise EngineError(400, f"prompt is {len(tokens)} tokens, over max_model_len", "messages")
    constraint = body.structured_outputs or {}
    regex = constraint.get("regex") if isinstance(constraint.get("regex"), str) else None
    thought = sim.preset.reasoning_tokens if thinks else 0
    output = place_output(sim.decision_answers, question, regex, before, sim.bpe, thought)
    request_id = f"chatcmpl-{request.headers.get('x-request-id') or uuid.uuid4().hex}"
    max_tokens = body.max_completion_tokens or body.max_tokens or 1
    sequence = Sequence(request_id=request_id, prompt=tokens, output=output, max_tokens=max_tokens,
                        priority=body.priority)
    completion = sim.completion(sequence, images, body.logprobs, body.top_logprobs or 0)
    return await unless_caller_leaves(request, whole(sim.engine, completion))


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    """OpenAI completions over a prompt of token ids or text, answered whole (what a priming request sends:
    its prompt ends exactly where the gateway wants the engine to keep a state)."""
    sim: SimulatedEngine = state.sim
    try:
        raw = json.loads(await request.body())
    except json.JSONDecodeError as exc:
        raise EngineError(400, f"invalid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise EngineError(400, "expected a JSON object")
    if raw.get("model") not in (None, sim.preset.model):
        raise EngineError(404, f"The model `{raw['model']}` does not exist.", "model")
    prompt = raw.get("prompt")
    if isinstance(prompt, str):
        tokens: list[Token] = list(sim.bpe.encode(prompt))
    elif isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        tokens = list(prompt)
    else:
        raise EngineError(400, "prompt must be a string or a non-empty list of token ids", "prompt")
    if len(tokens) >= sim.preset.max_model_len:
        raise EngineError(400, f"prompt is {len(tokens)} tokens, over max_model_len", "prompt")
    max_tokens = raw.get("max_tokens", 16)
    if type(max_tokens) is not int or max_tokens < 1:
        raise EngineError(400, "max_tokens must be a positive integer", "max_tokens")
    if sim.engine_core_dies():
        return _engine_core_failed(state)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    output = [TokenEvent("content", "。"), TokenEvent("content", END_OF_OUTPUT)][-max_tokens:]
    sequence = Sequence(request_id=request_id, prompt=tokens, output=output, max_tokens=max_tokens)
    text, finish = [], None
    async for event in sim.engine.generate(sequence):
        if isinstance(event, TokenEvent):
            text.append("" if event.text == END_OF_OUTPUT else event.text)
        else:
            finish = event
    assert finish is not None  # generate() always ends with a FinishEvent
    return Response({
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": sim.preset.model,
        "choices": [
            {"index": 0, "text": "".join(text), "logprobs": None, "finish_reason": finish.finish_reason}
        ],
        "usage": usage(finish, []),
    })


@get("/v1/models")
async def models(state: State) -> dict[str, Any]:
    """The one served model."""
    sim: SimulatedEngine = state.sim
    return {
        "object": "list",
        "data": [
            {
                "id": sim.preset.model,
                "object": "model",
                "created": int(sim.started),
                "owned_by": "vllm",
                "root": sim.preset.model_root or sim.preset.model,
                "parent": None,
                "max_model_len": sim.preset.max_model_len,
            }
        ],
    }


@get("/server_info")
async def server_info(state: State) -> dict[str, Any]:
    """vLLM's config as ``/server_info?config_format=json`` gives it (the real server serves the route with
    ``VLLM_SERVER_DEV_MODE=1``; the simulator always): here only what a gateway reads, the weights' dtype."""
    sim: SimulatedEngine = state.sim
    model_config = {"model": sim.preset.model_root or sim.preset.model, "dtype": f"torch.{sim.preset.dtype}"}
    return {"vllm_config": {"model_config": model_config}, "vllm_env": {}, "system_env": {}}


@get("/health")
async def health(state: State) -> Response[None]:
    """200 while the engine runs; 503 once its engine core died (and the server stayed up)."""
    sim: SimulatedEngine = state.sim
    return Response(None, status_code=503 if sim.engine_core_dead else 200)


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(state: State) -> bytes:
    """Prometheus text format."""
    sim: SimulatedEngine = state.sim
    return generate_latest(sim.metrics.registry)


@post("/tokenize", status_code=200)
async def tokenize(request: Request[Any, Any, Any], state: State) -> dict[str, Any]:
    """Token ids of a prompt or of chat messages (rendered with the template)."""
    sim: SimulatedEngine = state.sim
    try:
        raw = json.loads(await request.body())
    except json.JSONDecodeError as exc:
        raise EngineError(400, f"invalid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise EngineError(400, "expected a JSON object")
    if "messages" in raw:
        chat = parse_chat(raw, sim.preset.model)
        tokens, _, _ = sim.prompt_tokens(
            chat, add_generation_prompt=bool(raw.get("add_generation_prompt", True))
        )
    elif isinstance(raw.get("prompt"), str):
        # vLLM's completion-style body {"model", "prompt", "add_special_tokens"}: Qwen's tokenizer adds no
        # BOS, so add_special_tokens changes no count, but it is checked as vLLM checks it
        if raw.get("model") not in (None, sim.preset.model):
            raise EngineError(404, f"The model `{raw['model']}` does not exist.", "model")
        if not isinstance(raw.get("add_special_tokens", True), bool):
            raise EngineError(400, "add_special_tokens must be a boolean", "add_special_tokens")
        tokens = list(sim.bpe.encode(raw["prompt"]))
    else:
        raise EngineError(400, "either 'prompt' or 'messages' is required")
    return {
        "count": len(tokens),
        "max_model_len": sim.preset.max_model_len,
        "tokens": [token_id(t, sim.bpe) for t in tokens],
        "token_strs": None,
    }


class TruthQuery(BaseModel):
    """Body of ``POST /sim/truth``: an image as a chat request would carry it."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1)  # a data: URL
    uuid: str | None = None  # the identity the request would send (the gateway: the shaped frame's SHA-256)


@post("/sim/truth", status_code=200)
async def truth(data: JSONBody[TruthQuery], state: State) -> dict[str, Any]:
    """The simulator's ground truth for one frame: difficulty, whether thinking off flips it, each verdict."""
    sim: SimulatedEngine = state.sim
    image = decode_image(data.url, data.uuid, sim.grid)
    return {**asdict(sim.truth(image)), "label": str(image.label)}


@get("/sim/faults")
async def get_faults(state: State) -> dict[str, Any]:
    """The failure modes in force."""
    return asdict(state.sim.faults)


@post("/sim/faults", status_code=200)
async def set_faults(data: JSONBody[FaultsUpdate], state: State) -> dict[str, Any]:
    """Switch failure modes (tests and demos)."""
    state.sim.set_faults(Faults(**data.model_dump()))
    return asdict(state.sim.faults)


@post("/sim/reset_prefix_cache", status_code=200)
async def reset_prefix_cache(state: State) -> dict[str, Any]:
    """Empty the prefix cache, like vLLM's ``/reset_prefix_cache``."""
    state.sim.engine.reset_cache()
    return {"ok": True}


@get("/sim/info")
async def info(state: State) -> dict[str, Any]:
    """The preset and scheduler state, for tests and benchmarks."""
    sim: SimulatedEngine = state.sim
    return {
        "preset": asdict(sim.preset),
        "time_scale": sim.time_scale,
        "peak_running": sim.engine.peak_running,
        "peak_requests": sim.engine.peak_requests,
        "running": sim.engine.num_running,
        "waiting": sim.engine.num_waiting,
        "answers_whole": sim.engine.counters.answers_whole,
    }


@post("/sim/peaks", status_code=200)
async def peaks(state: State) -> dict[str, int]:
    """The most requests (running and waiting) and the most running since the last call, each then reset to
    the count now: a caller polling it reads the peak of every interval (a soak judges a cap per window)."""
    engine = state.sim.engine
    seen = {"peak_requests": engine.peak_requests, "peak_running": engine.peak_running}
    engine.peak_running = engine.num_running
    engine.peak_requests = engine.num_running + engine.num_waiting
    return seen


SIM_WIRES: dict[str, str] = {"vllm": "vLLM's wire", "llamacpp": "llama-server's wire"}
"""The simulator's engine kinds, each with the name ``modgate engine-sim`` prints."""


def sim_options_refused(
    kind: str, *, slots: int | None, ctx_size: int | None, loading_s: float
) -> str | None:
    """Why ``modgate engine-sim`` refuses these options for ``kind`` (llama-server's flags on vLLM)."""
    if kind not in SIM_WIRES:
        return f"unknown kind {kind!r}; choose {' or '.join(SIM_WIRES)}"
    if kind == "vllm" and (slots is not None or ctx_size is not None or loading_s):
        return "--slots, --ctx-size and --loading-s are llama-server's (--kind llamacpp)"
    return None


def create_sim_app(
    preset: SimPreset,
    time_scale: float,
    faults: Faults | None = None,
    *,
    kind: EngineKind = "vllm",
    llamacpp: LlamaCppOptions | None = None,
    vision: bool = True,
    loading_s: float = 0.0,
    on_exit: Callable[[], None] | None = None,
    say_counts_on_stop: bool = False,
) -> Litestar:
    """The simulated engine as an ASGI app, in vLLM's wire or (``kind="llamacpp"``) llama-server's.

    llama.cpp's wire runs llama.cpp's law with ``llamacpp``'s flags (its defaults otherwise); ``vision``
    False is a server started without ``--mmproj``, ``loading_s`` how long every route answers 503.
    ``on_exit``: how the server exits when its engine core dies, as vLLM's does (None: it stays up).
    ``say_counts_on_stop``: print :data:`COUNTS_LINE` when it stops (the ``modgate engine-sim`` process
    only: a simulator embedded in another command must not write into that command's output).
    """
    if kind == "llamacpp":
        return _llamacpp_app(
            preset, time_scale, faults, llamacpp or LlamaCppOptions(), vision, loading_s, say_counts_on_stop
        )
    sim = SimulatedEngine(preset, time_scale, faults)

    async def start() -> None:
        sim.engine.start()

    async def stop() -> None:
        await sim.engine.stop()
        if say_counts_on_stop:
            say_counts(sim)

    return Litestar(
        route_handlers=[chat_completions, completions, models, server_info, health, metrics, tokenize,
                        *SIM_ROUTES],
        state=State({"sim": sim, "on_exit": on_exit}),
        on_startup=[start],
        on_shutdown=[stop],
        exception_handlers={EngineError: _error_response},
        openapi_config=None,
        logging_config=None,  # the process owns logging; an app must not reconfigure the root logger
        debug=False,
    )


COUNTS_LINE: Final = "modgate engine-sim: answers whole "
"""What a stopping simulator prints, then its count: a soak adds up the counts of every run of a restarted
engine (bench/soak_parts.py), requests answered while it drained included."""


def say_counts(sim: SimulatedEngine) -> None:
    """Print the chat completions answered whole since start, once the last request has been answered."""
    print(f"{COUNTS_LINE}{sim.engine.counters.answers_whole}", flush=True)


SIM_ROUTES: Final = [get_faults, set_faults, truth, reset_prefix_cache, info, peaks, set_decision_answers]
"""The simulator's own routes, the same in either wire."""


def _llamacpp_app(
    preset: SimPreset,
    time_scale: float,
    faults: Faults | None,
    options: LlamaCppOptions,
    vision: bool,
    loading_s: float,
    say_counts_on_stop: bool,
) -> Litestar:
    sim = SimulatedEngine(preset, time_scale, faults, llamacpp=options)
    server = LlamaCppServer(sim, vision=vision)

    async def start() -> None:
        server.loaded_at = time.monotonic() + loading_s  # loading starts when the server does
        sim.engine.start()

    async def stop() -> None:
        await sim.engine.stop()
        if say_counts_on_stop:
            say_counts(sim)

    return Litestar(
        route_handlers=[*LLAMACPP_ROUTES, *SIM_ROUTES],
        state=State({"sim": sim, "llamacpp": server}),
        before_request=loading_guard(server),
        on_startup=[start],
        on_shutdown=[stop],
        exception_handlers={EngineError: llamacpp_error_response},
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
