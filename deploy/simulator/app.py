"""The simulated engine's HTTP face: the slice of vLLM's OpenAI-compatible server the gateway uses.

Its verdicts come from the marker squares of synthetic keyframes (``deploy.keyframes``), so quality code has
ground truth; a configurable share of thinking-off answers differ, and each frame's difficulty sets both
that and the confidence its logprobs carry (``deploy.simulator.truth``; ``POST /sim/truth`` answers it for a
frame). It answers in the form the request's grammar holds it to (the compact verdict regex, the JSON
schema or regex, a choice) and returns logprobs in vLLM's shape when asked. Faults can be switched on for
tests (``POST /sim/faults``) or from the command line.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import math
import random
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.params import JSONBody
from litestar.response import Stream
from PIL import Image, UnidentifiedImageError
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.keyframes import Label, read_label
from deploy.simulator.engine import FinishEvent, Sequence, SimScheduler, TokenEvent
from deploy.simulator.metrics import SimMetrics
from deploy.simulator.presets import SimPreset
from deploy.simulator.tokenizer import ImageSlot, Token, render_chat, split_text, token_id
from deploy.simulator.truth import FrameTruth, SimVerdict, frame_truth
from shaping.errors import ImageRejected
from shaping.tokens import TokenGrid, image_tokens
from shaping.verdict import ACTIONS, MODEL_CATEGORIES, compact_text

END_OF_OUTPUT = "<|im_end|>"  # the stop token: generated (one decode step), counted, never in the text
THINK_END = "</think>"
MASKED_LOGPROB = -9999.0  # what vLLM writes for a token the grammar masked (-inf, clamped)

# A text-only request (no image) is judged by words: ground truth for text as marker squares are for frames.
TEXT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "violence": ("kill", "stab", "shoot", "gun", "knife", "attack", "杀", "枪", "砍"),
    "violence/graphic": ("blood", "gore", "corpse", "血", "尸体"),
    "sexual": ("nude", "porn", "explicit sex", "色情", "裸"),
    "self-harm": ("suicide", "self-harm", "cut myself", "自杀", "自残"),
    "hate": ("hate speech", "slur", "仇恨"),
    "harassment": ("harass", "bully", "humiliate", "霸凌"),
    "illicit": ("cocaine", "heroin", "meth", "counterfeit", "毒品", "赌博"),
}


def text_verdict(text: str) -> dict[str, Any]:
    """The verdict on a text-only request: block with the categories its words name, else allow."""
    lowered = text.lower()
    named = [category for category, words in TEXT_KEYWORDS.items() if any(w in lowered for w in words)]
    if named:
        return {"verdict": "block", "categories": named, "confidence": 0.9}
    return {"verdict": "allow", "categories": [], "confidence": 0.9}


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user turn (its text parts joined): what a text-only request asks about."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content", "")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [part for part in content if isinstance(part, dict) and part.get("type") == "text"]
            return "\n".join(str(part.get("text", "")) for part in texts)
    return ""


@dataclass
class Faults:
    """Failure modes, each a probability per request (slow adds ``slow_s`` before the first token)."""

    error_rate: float = 0.0
    slow_rate: float = 0.0
    slow_s: float = 5.0
    cut_stream_rate: float = 0.0
    malformed_rate: float = 0.0
    seed: int = 0


class FaultsUpdate(BaseModel):
    """Body of ``POST /sim/faults``."""

    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(default=0.0, ge=0, le=1)
    slow_rate: float = Field(default=0.0, ge=0, le=1)
    slow_s: float = Field(default=5.0, ge=0)
    cut_stream_rate: float = Field(default=0.0, ge=0, le=1)
    malformed_rate: float = Field(default=0.0, ge=0, le=1)
    seed: int = 0


class EngineError(HTTPException):
    """An error in vLLM's OpenAI shape."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(status_code=status, detail=message)
        self.param = param


def _error_response(_: Request[Any, Any, Any], exc: EngineError) -> Response[dict[str, Any]]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}.get(
        exc.status_code, "BadRequestError"
    )
    return Response(
        {"error": {"message": exc.detail, "type": kind, "param": exc.param, "code": exc.status_code}},
        status_code=exc.status_code,
    )


class ChatRequest(BaseModel):
    """The fields of vLLM's chat request that the simulator reads; others are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # as vLLM: no model means the served one
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = 0
    thinking_token_budget: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's default --max-logprobs is 20


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """An image as the engine sees it: identity, label and token count."""

    identity: str
    tokens: int
    label: Label


def _decode_image(url: str, explicit_uuid: str | None, grid: TokenGrid) -> DecodedImage:
    if not url.startswith("data:"):
        raise EngineError(400, "only data: image URLs are supported by this engine", "messages")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise EngineError(400, "image data URL must be base64-encoded", "messages")
    try:
        raw = base64.b64decode(payload, validate=True)
        with Image.open(io.BytesIO(raw)) as image:
            image.load()
            width, height = image.size
            label = read_label(image)
    except (binascii.Error, UnidentifiedImageError, OSError, ValueError) as exc:
        raise EngineError(400, f"failed to load image: {exc}", "messages") from exc
    identity = explicit_uuid or f"{zlib.crc32(raw):08x}-{len(raw)}"
    try:
        tokens = image_tokens(width, height, grid)
    except ImageRejected as exc:  # e.g. an aspect ratio over 200:1, which the model's processor refuses
        raise EngineError(400, f"failed to process image: {exc}", "messages") from exc
    return DecodedImage(identity=identity, tokens=tokens, label=label)


def _user_parts(content: Any, grid: TokenGrid) -> tuple[list[Token | str], list[DecodedImage]]:
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        raise EngineError(400, "message content must be a string or a list of parts", "messages")
    parts: list[Token | str] = []
    images: list[DecodedImage] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(str(part.get("text", "")))
        elif kind == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else None
            if not isinstance(url, str):
                raise EngineError(400, "image_url.url is required", "messages")
            image = _decode_image(url, part.get("uuid"), grid)
            images.append(image)
            parts.append("<|vision_start|>")
            parts.extend(ImageSlot(image.identity, i) for i in range(image.tokens))
            parts.append("<|vision_end|>")
        else:
            raise EngineError(400, f"unsupported content part type {kind!r}", "messages")
    return parts, images


class SimulatedEngine:
    """Request handling on top of the scheduler: templates, verdicts, faults and responses."""

    def __init__(self, preset: SimPreset, time_scale: float, faults: Faults | None = None) -> None:
        self.preset = preset
        self.time_scale = time_scale
        self.faults = faults or Faults()
        self.metrics = SimMetrics(preset.model)
        self.engine = SimScheduler(
            preset, time_scale, observe_ttft=self.metrics.ttft.observe, observe_e2e=self.metrics.e2e.observe
        )
        self.metrics.watch(self.engine)
        self.grid = TokenGrid(
            pixels_per_token=preset.pixels_per_token,
            min_pixels=4 * preset.pixels_per_token**2,
            max_pixels=preset.max_image_pixels,
            token_budget=preset.max_image_pixels // preset.pixels_per_token**2,
        )
        self._rng = random.Random(self.faults.seed)
        self.started = time.time()

    def set_faults(self, faults: Faults) -> None:
        """Switch failure modes at runtime."""
        self.faults = faults
        self._rng = random.Random(faults.seed)

    def prompt_tokens(
        self, request: ChatRequest, add_generation_prompt: bool = True
    ) -> tuple[list[Token], list[DecodedImage], bool]:
        """Render the chat template into tokens; answers (tokens, images, enable_thinking)."""
        kwargs = request.chat_template_kwargs or {}
        enable_thinking = bool(kwargs.get("enable_thinking", True))
        messages: list[tuple[str, list[Token | str]]] = []
        images: list[DecodedImage] = []
        for message in request.messages:
            role = message.get("role")
            if role not in ("system", "user", "assistant"):
                raise EngineError(400, f"unsupported role {role!r}", "messages")
            parts, found = _user_parts(message.get("content", ""), self.grid)
            messages.append((role, parts))
            images += found
        return render_chat(messages, enable_thinking, add_generation_prompt), images, enable_thinking

    def truth(self, image: DecodedImage) -> FrameTruth:
        """The simulator's ground truth for one decoded image (deploy.simulator.truth)."""
        return frame_truth(
            image.identity,
            image.label,
            disagreement=self.preset.thinking_off_disagreement,
            separation=self.preset.separation_auroc,
        )

    def _answer(
        self, request: ChatRequest, truths: list[FrameTruth], enable_thinking: bool
    ) -> tuple[str, list[float]]:
        """The answer text in the form the request's grammar allows, and each verdict's confidence."""
        verdicts = [t.verdict(enable_thinking) for t in truths]
        confidences = [t.confidence(enable_thinking) for t in truths]
        if not truths:  # a text-only request: the words decide (text_verdict)
            said = text_verdict(last_user_text(request.messages))
            verdicts = [SimVerdict(said["verdict"], tuple(said["categories"]))]
            confidences = [said["confidence"]]
        objects = [
            {"verdict": v.action, "categories": list(v.categories), "confidence": round(c, 2)}
            for v, c in zip(verdicts, confidences, strict=True)
        ]
        compact = "\n".join(
            compact_text(v.action, v.categories)  # type: ignore[arg-type]  # the label's action: one of three
            for v in verdicts
        )
        one_json = json.dumps(objects[0], separators=(",", ":"), ensure_ascii=False)
        structured = request.structured_outputs or {}
        if isinstance(structured.get("regex"), str):
            try:
                grammar = re.compile(structured["regex"])
            except re.error as exc:
                message = f"invalid regex in structured_outputs: {exc}"
                raise EngineError(400, message, "structured_outputs") from exc
            for text in (compact, one_json):
                if grammar.fullmatch(text):
                    return text, confidences
            message = "the simulator cannot write a verdict this regex allows"
            raise EngineError(400, message, "structured_outputs")
        if "choice" in structured:
            choices = [str(c) for c in structured["choice"]]
            wanted = compact if compact in choices else verdicts[0].action
            return (wanted if wanted in choices else choices[0]), confidences
        schema: dict[str, Any] = {}
        if request.response_format and request.response_format.get("type") == "json_schema":
            schema = request.response_format.get("json_schema", {}).get("schema", {})
        elif "json" in structured and isinstance(structured["json"], dict):
            schema = structured["json"]
        if "frames" in schema.get("properties", {}):
            return json.dumps({"frames": objects}, separators=(",", ":"), ensure_ascii=False), confidences
        return one_json, confidences

    def plan_output(
        self, request: ChatRequest, images: list[DecodedImage], enable_thinking: bool
    ) -> list[TokenEvent]:
        """The tokens this request will generate: reasoning (thinking on), the answer, the stop token."""
        truths = [self.truth(image) for image in images]
        if self.faults.malformed_rate and self._rng.random() < self.faults.malformed_rate:
            answer, confidences = "I think this frame looks fine, probably.", list[float]()
        else:
            answer, confidences = self._answer(request, truths, enable_thinking)
        output: list[TokenEvent] = []
        if enable_thinking:
            identity = images[0].identity if images else "text"
            jitter = self.preset.reasoning_jitter
            spread = zlib.crc32(identity.encode()) % (2 * jitter + 1) - jitter if jitter else 0
            count = max(1, self.preset.reasoning_tokens + spread)
            if request.thinking_token_budget is not None:
                count = min(count, max(1, request.thinking_token_budget))
            words = ("画面", "中", "显示", "人物", "场景", "没有", "明显", "违规", "内容", "，", "判断", "。")
            output += [TokenEvent("reasoning", words[i % len(words)]) for i in range(count)]
            # the closing tag: generated and counted, but neither reasoning (not in reasoning_tokens) nor text
            output.append(TokenEvent("content", THINK_END))
        references = [t.thinking_on for t in truths] or [SimVerdict("allow", ())]  # text only: one verdict
        output += _answer_tokens(answer, confidences, references)
        output.append(TokenEvent("content", END_OF_OUTPUT))
        return output

    def usage(self, finish: FinishEvent, images: list[DecodedImage]) -> dict[str, Any]:
        """``usage`` as vLLM reports it with ``--enable-prompt-tokens-details``."""
        return {
            "prompt_tokens": finish.prompt_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens,
            "completion_tokens": finish.completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": finish.cached_tokens,
                "created_cache_tokens": finish.created_cache_tokens,
                "multimodal_tokens": {"image": sum(image.tokens for image in images)},
            },
            "completion_tokens_details": {"reasoning_tokens": finish.reasoning_tokens},
        }


def _parse_chat(body: bytes | dict[str, Any], served_model: str) -> ChatRequest:
    try:
        if isinstance(body, dict):
            request = ChatRequest.model_validate(body)
        else:
            request = ChatRequest.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise EngineError(400, f"{param}: {first.get('msg')}", param) from exc
    if request.model is not None and request.model != served_model:
        raise EngineError(404, f"The model `{request.model}` does not exist.", "model")
    if request.stream_options is not None and not request.stream:
        raise EngineError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    return request


def _chunk(
    request_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None,
    logprobs: list[dict[str, Any]] | None = None,
) -> bytes:
    body = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }
        ],
    }
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any], state: State) -> Response[Any]:
    """OpenAI chat completions, streamed or not."""
    sim: SimulatedEngine = state.sim
    body = _parse_chat(await request.body(), sim.preset.model)
    faults = sim.faults
    if faults.error_rate and sim._rng.random() < faults.error_rate:
        raise EngineError(500, "simulated engine failure")
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
    slow = faults.slow_s if faults.slow_rate and sim._rng.random() < faults.slow_rate else 0.0
    cut = bool(faults.cut_stream_rate) and sim._rng.random() < faults.cut_stream_rate
    created = int(time.time())
    headers: dict[str, str] = {}
    model = sim.preset.model

    top = body.top_logprobs or 0
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        async def stream() -> AsyncIterator[bytes]:
            if slow:
                await asyncio.sleep(slow)
            yield _chunk(request_id, model, created, {"role": "assistant", "content": ""}, None)
            sent = 0
            last: TokenEvent | None = None
            async for event in sim.engine.generate(sequence):
                if isinstance(event, TokenEvent):
                    sent += 1
                    if event.text == END_OF_OUTPUT:  # as vLLM: the stop token rides on the finishing chunk
                        last = event
                        continue
                    # as vLLM's reasoning parser: the closing tag's chunk has an empty delta, and logprobs
                    delta: dict[str, Any] = {} if event.text == THINK_END else {event.channel: event.text}
                    entries = [logprob_entry(event, top)] if body.logprobs else None
                    yield _chunk(request_id, model, created, delta, None, entries)
                    if cut and sent >= max(1, len(sequence.output) // 2):
                        return  # the connection ends mid-answer, with no finish and no [DONE]
                    continue
                entries = [logprob_entry(last, top)] if body.logprobs and last is not None else None
                final: dict[str, Any] = {"content": ""} if last else {}
                yield _chunk(request_id, model, created, final, event.finish_reason, entries)
                if include_usage:
                    usage_chunk = {
                        "id": request_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": sim.usage(event, images),
                    }
                    yield b"data: " + json.dumps(usage_chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return Stream(stream(), media_type="text/event-stream", headers=headers)

    if slow:
        await asyncio.sleep(slow)
    reasoning: list[str] = []
    content: list[str] = []
    generated: list[TokenEvent] = []
    finish: FinishEvent | None = None
    async for event in sim.engine.generate(sequence):
        if isinstance(event, TokenEvent):
            generated.append(event)
            if event.text not in (END_OF_OUTPUT, THINK_END):
                (reasoning if event.channel == "reasoning" else content).append(event.text)
        else:
            finish = event
    assert finish is not None  # generate() always ends with a FinishEvent
    if cut:
        return Response(
            b'{"id": "' + request_id.encode() + b'", "choices": [',
            headers=headers,
            media_type="application/json",
        )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(content) if content else None,
        "reasoning": "".join(reasoning) if reasoning else None,
        "tool_calls": [],
    }
    return Response(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": (
                        {"content": [logprob_entry(e, top) for e in generated]} if body.logprobs else None
                    ),
                    "finish_reason": finish.finish_reason,
                }
            ],
            "usage": sim.usage(finish, images),
        },
        headers=headers,
    )


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


@get("/health")
async def health() -> Response[None]:
    """200 while the engine runs."""
    return Response(None, status_code=200)


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
        chat = _parse_chat(raw, sim.preset.model)
        tokens, _, _ = sim.prompt_tokens(
            chat, add_generation_prompt=bool(raw.get("add_generation_prompt", True))
        )
    elif isinstance(raw.get("prompt"), str):
        tokens = list(split_text(raw["prompt"]))
    else:
        raise EngineError(400, "either 'prompt' or 'messages' is required")
    return {
        "count": len(tokens),
        "max_model_len": sim.preset.max_model_len,
        "tokens": [token_id(t) for t in tokens],
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
    image = _decode_image(data.url, data.uuid, sim.grid)
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
    state.sim.engine.cache.reset()
    return {"ok": True}


@get("/sim/info")
async def info(state: State) -> dict[str, Any]:
    """The preset and scheduler state, for tests and benchmarks."""
    sim: SimulatedEngine = state.sim
    return {
        "preset": asdict(sim.preset),
        "time_scale": sim.time_scale,
        "peak_running": sim.engine.peak_running,
        "running": sim.engine.num_running,
        "waiting": sim.engine.num_waiting,
    }


def create_sim_app(preset: SimPreset, time_scale: float, faults: Faults | None = None) -> Litestar:
    """The simulated engine as an ASGI app."""
    sim = SimulatedEngine(preset, time_scale, faults)

    async def start() -> None:
        sim.engine.start()

    async def stop() -> None:
        await sim.engine.stop()

    return Litestar(
        route_handlers=[
            chat_completions,
            models,
            health,
            metrics,
            tokenize,
            get_faults,
            set_faults,
            truth,
            reset_prefix_cache,
            info,
        ],
        state=State({"sim": sim}),
        on_startup=[start],
        on_shutdown=[stop],
        exception_handlers={EngineError: _error_response},
        openapi_config=None,
        logging_config=None,  # the process owns logging; an app must not reconfigure the root logger
        debug=False,
    )


# --- the answer's tokens and their logprobs ----------------------------------------------------------------

_CATEGORY_HEADS = tuple(dict.fromkeys(split_text(c)[0] for c in MODEL_CATEGORIES))  # "sexual", "violence", …


def _distribution(
    chosen: str, probability: float, others: list[str], weights: list[float]
) -> list[tuple[str, float]]:
    """``chosen`` at ``probability``, the rest shared by ``weights``; as (token, logprob), best first."""
    total = sum(weights) or 1.0
    rest = max(0.0, 1.0 - probability)
    pairs = [(chosen, probability)] + [(o, rest * w / total) for o, w in zip(others, weights, strict=True)]
    return sorted(
        ((token, math.log(p) if p > 0 else MASKED_LOGPROB) for token, p in pairs), key=lambda pair: -pair[1]
    )


def _action_alternatives(chosen: str, confidence: float, reference: str) -> list[tuple[str, float]]:
    """The three actions at a verdict's first token: the runner-up is what thinking on would say."""
    others: list[str] = [a for a in ACTIONS if a != chosen]
    runner_up = reference if reference != chosen else ("review" if chosen != "review" else "allow")
    others.sort(key=lambda a: a != runner_up)
    return _distribution(chosen, confidence, others, [0.75, 0.25])


def _category_alternatives(head: str, confidence: float) -> list[tuple[str, float]]:
    """The categories' first tokens at a category's place: the named one at ``(1 + confidence) / 2``."""
    others = [h for h in _CATEGORY_HEADS if h != head]
    return _distribution(head, (1 + confidence) / 2, others, [1.0] * len(others))


def _verdict_places(answer: str) -> tuple[dict[int, int], dict[int, int]]:
    """Character offsets of each verdict's action and of each category it names, mapped to the frame."""
    actions: dict[int, int] = {}
    categories: dict[int, int] = {}
    if answer.startswith("{"):
        for frame, found in enumerate(re.finditer(r'"verdict":"', answer)):
            actions[found.end()] = frame
            listed = re.compile(r'"categories":\[([^\]]*)\]').search(answer, found.end())
            if listed is not None:
                for item in re.finditer(r'"([^"]*)"', listed.group(1)):
                    categories[listed.start(1) + item.start(1)] = frame
        return actions, categories
    position = 0
    for frame, line in enumerate(answer.split("\n")):
        actions[position] = frame
        if line.startswith("block:"):
            offset = position + len("block:")
            for name in line[len("block:") :].split(","):
                categories[offset] = frame
                offset += len(name) + 1
        position += len(line) + 1
    return actions, categories


def _answer_tokens(answer: str, confidences: list[float], references: list[SimVerdict]) -> list[TokenEvent]:
    """The answer as tokens; at each verdict's action and categories, the alternatives the model weighed."""
    actions, categories = _verdict_places(answer)
    events: list[TokenEvent] = []
    position = 0
    for piece in split_text(answer):
        alternatives: list[tuple[str, float]] = [(piece, 0.0)]
        if position in actions and actions[position] < min(len(confidences), len(references)):
            frame = actions[position]
            alternatives = _action_alternatives(piece, confidences[frame], references[frame].action)
        elif position in categories and categories[position] < len(confidences):
            alternatives = _category_alternatives(piece, confidences[categories[position]])
        logprob = dict(alternatives).get(piece, 0.0)
        events.append(TokenEvent("content", piece, logprob, tuple(alternatives)))
        position += len(piece)
    return events


def logprob_entry(event: TokenEvent, top: int) -> dict[str, Any]:
    """One token in vLLM's ``logprobs.content`` shape: token, logprob, bytes and ``top`` alternatives.

    As vLLM: exactly ``top`` alternatives (padded with tokens the grammar masked, at -9999.0).
    """
    alternatives = list(event.alternatives) or [(event.text, event.logprob)]
    listed = dict(alternatives)
    fillers = (t for t in ("{", "}", '"', ":", ",", "a", "b", "c", "d", "e", "f", "g") if t not in listed)
    while len(alternatives) < top:
        alternatives.append((next(fillers), MASKED_LOGPROB))
    return {
        "token": event.text,
        "logprob": event.logprob,
        "bytes": list(event.text.encode()),
        "top_logprobs": [
            {"token": token, "logprob": logprob, "bytes": list(token.encode())}
            for token, logprob in alternatives[:top]
        ],
    }
