"""The simulated engine behind the routes: the chat template, the ground truth, the planned output, faults."""

from __future__ import annotations

import random
import re
import time
import zlib
from dataclasses import dataclass

from deploy.simulator.answers import END_OF_OUTPUT, THINK_END, answer_text, answer_tokens
from deploy.simulator.engine import Sequence, TokenEvent
from deploy.simulator.laws import make_scheduler
from deploy.simulator.llamacpp_law import LlamaCppOptions
from deploy.simulator.metrics import SimMetrics
from deploy.simulator.presets import SimPreset
from deploy.simulator.protocol import ChatRequest, DecodedImage, EngineError, user_parts
from deploy.simulator.responses import Completion
from deploy.simulator.tokenizer import ImageSlot, Token, render_chat
from deploy.simulator.truth import FrameTruth, frame_truth
from shaping.bpe import qwen_bpe
from shaping.tokens import TokenGrid


@dataclass
class Faults:
    """Failure modes, each a probability per request (slow adds ``slow_s`` before the first token)."""

    error_rate: float = 0.0
    slow_rate: float = 0.0
    slow_s: float = 5.0
    cut_stream_rate: float = 0.0
    malformed_rate: float = 0.0
    busy_rate: float = 0.0  # answered 503 "busy" (vLLM's queue full, llama-server's no free slot)
    seed: int = 0


class SimulatedEngine:
    """Request handling on top of the scheduler: templates, verdicts and faults."""

    def __init__(
        self,
        preset: SimPreset,
        time_scale: float,
        faults: Faults | None = None,
        llamacpp: LlamaCppOptions | None = None,
    ) -> None:
        self.preset = preset
        self.time_scale = time_scale
        self.faults = faults or Faults()
        self.metrics = SimMetrics(preset.model)
        self.bpe = qwen_bpe(preset.tokenizer)
        # vLLM's scheduling law, or llama.cpp's server's with its options (deploy.simulator.laws).
        self.engine = make_scheduler(
            preset, time_scale, llamacpp=llamacpp,
            observe_ttft=self.metrics.ttft.observe, observe_e2e=self.metrics.e2e.observe,
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
        # set by POST /sim/decisions (deploy/simulator/decisions.py)
        self.decision_answers: dict[str, dict[str, float]] = {}
        self.engine_core_dead = False  # the engine core died (a hybrid model in float32): every request 500s

    def engine_core_dies(self) -> bool:
        """Whether this generation request kills the engine core: any, on a hybrid model served in float32
        (vLLM's CPU build: ``AssertionError: CPU GDN attention requires BF16.``), and every one after."""
        if self.preset.mamba_cache_mode == "align" and self.preset.dtype == "float32":
            self.engine_core_dead = True
        return self.engine_core_dead

    def set_faults(self, faults: Faults) -> None:
        """Switch failure modes at runtime."""
        self.faults = faults
        self._rng = random.Random(faults.seed)

    def chance(self, rate: float) -> bool:
        """Whether a fault of this probability strikes now (a rate of 0 draws nothing from the seed)."""
        return bool(rate) and self._rng.random() < rate

    def prompt_tokens(
        self, request: ChatRequest, add_generation_prompt: bool = True
    ) -> tuple[list[Token], list[DecodedImage], bool]:
        """Render the chat template into tokens; answers (tokens, images, enable_thinking)."""
        kwargs = request.chat_template_kwargs or {}
        enable_thinking = bool(kwargs.get("enable_thinking", True))
        messages: list[tuple[str, list[ImageSlot | str]]] = []
        images: list[DecodedImage] = []
        for message in request.messages:
            role = message.get("role")
            if role not in ("system", "user", "assistant"):
                raise EngineError(400, f"unsupported role {role!r}", "messages")
            parts, found = user_parts(message.get("content", ""), self.grid)
            messages.append((role, parts))
            images += found
        return (
            render_chat(messages, enable_thinking, add_generation_prompt, bpe=self.bpe),
            images,
            enable_thinking,
        )

    def completion(
        self, sequence: Sequence, images: list[DecodedImage], logprobs: bool, top: int
    ) -> Completion:
        """How a planned sequence is answered, the slow and cut-stream faults drawn for it."""
        slow = self.faults.slow_s if self.chance(self.faults.slow_rate) else 0.0
        return Completion(
            request_id=sequence.request_id,
            model=self.preset.model,
            created=int(time.time()),
            sequence=sequence,
            images=images,
            logprobs=logprobs,
            top=top,
            slow=slow,
            cut=self.chance(self.faults.cut_stream_rate),
        )

    def truth(self, image: DecodedImage) -> FrameTruth:
        """The simulator's ground truth for one decoded image (deploy.simulator.truth)."""
        return frame_truth(
            image.identity,
            image.label,
            disagreement=self.preset.thinking_off_disagreement,
            separation=self.preset.separation_auroc,
        )

    def forced_output(self, text: str, enable_thinking: bool) -> list[TokenEvent]:
        """What any model writes under a grammar that admits one text: with thinking on, the text before
        ``</think>`` is the thought (all of it, when the text never closes it), then the stop token."""
        thought, closed, answer = text.partition(THINK_END) if enable_thinking else ("", "", text)
        if enable_thinking and not closed:
            thought, answer = text, ""
        output = [TokenEvent("reasoning", piece) for piece in self.bpe.pieces(thought)]
        if closed:
            output.append(TokenEvent("content", THINK_END))
        output += [TokenEvent("content", piece) for piece in self.bpe.pieces(answer)]
        return [*output, TokenEvent("content", END_OF_OUTPUT)]

    def plan_output(
        self,
        request: ChatRequest,
        images: list[DecodedImage],
        enable_thinking: bool,
        grammar: re.Pattern[str] | None = None,
    ) -> list[TokenEvent]:
        """The tokens this request will generate: reasoning (thinking on), the answer, the stop token.

        ``grammar`` (llama.cpp's, held from the first generated token): the whole output, thought and
        ``</think>`` included, must be one it admits; one that admits no thought gets none.
        """
        truths = [self.truth(image) for image in images]
        thought: list[TokenEvent] = []
        if enable_thinking:
            identity = images[0].identity if images else "text"
            jitter = self.preset.reasoning_jitter
            spread = zlib.crc32(identity.encode()) % (2 * jitter + 1) - jitter if jitter else 0
            count = max(1, self.preset.reasoning_tokens + spread)
            if request.thinking_token_budget is not None:
                count = min(count, max(1, request.thinking_token_budget))
            words = ("画面", "中", "显示", "人物", "场景", "没有", "明显", "违规", "内容", "，", "判断", "。")
            thought += [TokenEvent("reasoning", words[i % len(words)]) for i in range(count)]
            # the closing tag: generated and counted, but neither reasoning (not in reasoning_tokens) nor text
            thought.append(TokenEvent("content", THINK_END))
        if self.chance(self.faults.malformed_rate):
            answer, confidences = "I think this frame looks fine, probably.", list[float]()
        elif grammar is None:
            answer, confidences = answer_text(request, truths, enable_thinking)
        else:
            written = "".join(event.text for event in thought)
            try:
                answer, confidences = answer_text(
                    request, truths, enable_thinking, lambda text: grammar.fullmatch(written + text)
                )
            except EngineError:
                if not thought:
                    raise
                thought = []  # the grammar holds the first token to the answer: no room for a thought
                answer, confidences = answer_text(request, truths, enable_thinking, grammar.fullmatch)
        output = [*thought, *answer_tokens(self.bpe, answer, confidences)]
        output.append(TokenEvent("content", END_OF_OUTPUT))
        return output
