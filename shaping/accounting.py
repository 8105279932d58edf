"""Prompt token accounting: what one engine request will cost, predicted before it is sent.

A request's prompt is four parts, each counted its own way:

- the scaffold: the system prompt, the chat template and the generation prompt (which depends on the
  thinking mode), measured once per mode through the engine's ``POST /tokenize`` with the canonical
  messages and an empty user text;
- the user text, measured once per distinct text through ``/tokenize`` (the plain-prompt form);
- the image tokens, from :mod:`shaping.tokens` (the shaped frame's grid: exact on a Qwen-VL engine);
- the per-image overhead: what an image adds besides its image tokens (``<|vision_start|>`` and
  ``<|vision_end|>`` on Qwen), measured once with the first frame the gateway sends.

The sum is compared with the engine's ``usage`` afterwards; a difference means the gateway's model of the
engine is wrong (another tokenizer, template or image processor than the one it was calibrated on), and
every figure built on it (token budgets, prefix planning, benchmarks) is wrong with it.

Sans-IO: :class:`TokenAccountant` says which measurements it lacks (:meth:`TokenAccountant.pending`), the
caller sends them and hands the counts back (:meth:`TokenAccountant.record`). Nothing here does HTTP.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

MeasurementKind = Literal["scaffold", "text", "image_overhead"]

TEXT_CACHE_SIZE = 256
"""Distinct user texts whose token count is kept (the fixed instructions, and a few caller texts)."""


class AccountedImage(Protocol):
    """What accounting needs of a shaped keyframe."""

    @property
    def data_url(self) -> str: ...

    @property
    def sha256(self) -> str: ...

    @property
    def image_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Measurement:
    """One ``POST /tokenize`` the accountant needs, and what its count will stand for."""

    kind: MeasurementKind
    key: str  # the thinking mode ("on"/"off") for the scaffold, the text itself for a text
    body: dict[str, Any]
    image_tokens: int = 0  # for an image-overhead measurement: the frame's own image tokens


@dataclass(frozen=True, slots=True)
class PromptPrediction:
    """The prompt tokens one engine request should cost, part by part."""

    scaffold: int
    text: int
    image: int
    image_overhead: int

    @property
    def total(self) -> int:
        """Every prompt token of the request."""
        return self.scaffold + self.text + self.image + self.image_overhead


@dataclass(frozen=True, slots=True)
class TokenMismatch:
    """A prediction the engine's ``usage`` contradicted."""

    predicted: PromptPrediction
    prompt_tokens: int
    image_tokens: int

    @property
    def difference(self) -> int:
        """Engine minus prediction, over the whole prompt."""
        return self.prompt_tokens - self.predicted.total

    def describe(self) -> str:
        """One line for the log: the parts predicted, what the engine counted, and the likely culprit."""
        parts = self.predicted
        line = (
            f"prompt tokens: predicted {parts.total:,} (scaffold {parts.scaffold:,} + text {parts.text:,} + "
            f"image {parts.image:,} + image overhead {parts.image_overhead:,}), engine counted "
            f"{self.prompt_tokens:,} ({self.difference:+,})"
        )
        if self.image_tokens and self.image_tokens != parts.image:
            line += (
                f"; image tokens predicted {parts.image:,}, engine counted {self.image_tokens:,}: the token "
                "grid (pixels per token, budget) does not match the engine's image processor"
            )
        return line


def compare_usage(predicted: PromptPrediction, prompt_tokens: int, image_tokens: int) -> TokenMismatch | None:
    """A mismatch when the engine's prompt tokens (or its image tokens, where it reports them) differ.

    ``image_tokens`` 0 means the engine did not report them (older servers): only the total is compared.
    """
    if prompt_tokens <= 0:
        return None  # no usage at all: nothing to compare against, which is not a mismatch
    if prompt_tokens != predicted.total or (image_tokens and image_tokens != predicted.image):
        return TokenMismatch(predicted, prompt_tokens, image_tokens)
    return None


def scaffold_messages(system_text: str, image: AccountedImage | None = None) -> list[dict[str, Any]]:
    """The canonical messages with an empty user text (and optionally one image), as the gateway sends them.

    The image part is built as :func:`shaping.prompt.user_content` builds it.
    """
    content: list[dict[str, Any]] = []
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": image.data_url}, "uuid": image.sha256})
    content.append({"type": "text", "text": ""})
    return [{"role": "system", "content": system_text}, {"role": "user", "content": content}]


def _mode_key(enable_thinking: bool) -> str:
    return "on" if enable_thinking else "off"


class TokenAccountant:
    """Learns an engine's prompt arithmetic once, then predicts every request's prompt tokens."""

    def __init__(self, system_text: str, model: str) -> None:
        self.system_text = system_text
        self.model = model
        self._scaffold: dict[str, int] = {}
        self._image_overhead: int | None = None
        self._texts: OrderedDict[str, int] = OrderedDict()

    def _chat_body(self, enable_thinking: bool, image: AccountedImage | None = None) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": scaffold_messages(self.system_text, image),
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": enable_thinking},
        }

    def pending(
        self, enable_thinking: bool, user_text: str, images: Sequence[AccountedImage]
    ) -> list[Measurement]:
        """The measurements still missing before this request can be predicted (empty: predict now).

        The image overhead is measured against the scaffold of the same mode, so it waits for that one:
        call again after recording until nothing is pending.
        """
        mode = _mode_key(enable_thinking)
        wanted: list[Measurement] = []
        if mode not in self._scaffold:
            wanted.append(Measurement("scaffold", mode, self._chat_body(enable_thinking)))
        if user_text and user_text not in self._texts:
            body = {"model": self.model, "prompt": user_text, "add_special_tokens": False}
            wanted.append(Measurement("text", user_text, body))
        if images and self._image_overhead is None and mode in self._scaffold:
            first = images[0]
            body = self._chat_body(enable_thinking, first)
            wanted.append(Measurement("image_overhead", mode, body, first.image_tokens))
        return wanted

    def record(self, measurement: Measurement, count: int) -> None:
        """Keep what one ``/tokenize`` answered."""
        if measurement.kind == "scaffold":
            self._scaffold[measurement.key] = count
        elif measurement.kind == "text":
            self._texts[measurement.key] = count
            while len(self._texts) > TEXT_CACHE_SIZE:
                self._texts.popitem(last=False)
        else:
            self._image_overhead = count - self._scaffold[measurement.key] - measurement.image_tokens

    def predict(
        self, enable_thinking: bool, user_text: str, images: Sequence[AccountedImage]
    ) -> PromptPrediction | None:
        """The request's prompt tokens, or None while a measurement it needs is missing."""
        scaffold = self._scaffold.get(_mode_key(enable_thinking))
        text = self._texts.get(user_text) if user_text else 0
        if scaffold is None or text is None or (images and self._image_overhead is None):
            return None
        if user_text:
            self._texts.move_to_end(user_text)
        overhead = self._image_overhead or 0
        return PromptPrediction(
            scaffold=scaffold,
            text=text,
            image=sum(image.image_tokens for image in images),
            image_overhead=overhead * len(images),
        )
