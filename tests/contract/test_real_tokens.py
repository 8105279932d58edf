"""Qwen's real token boundaries, on the real vLLM (the tiny model carries Qwen2.5's BPE) and on the
simulator set to the same family: counts, the chat template, a verdict's tokens, its logprob positions and
category spans.

What is asserted is ``shaping.bpe``'s count, the one the simulator, token prediction and the cache planner
use: if the engine cut differently, every figure resting on those counts would be wrong with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from deploy.engine_cpu import TINY_VLM_FAMILY
from shaping.bpe import QwenBPE, qwen_bpe
from shaping.confidence import TokenLogprob, with_confidence
from shaping.prompt import load_system_prompt, prompt_version_for
from shaping.verdict import parse_engine_output
from tests.support import SimFactory

TEXTS = [
    "allow",
    "review",
    "block:violence",
    "block:self-harm",
    "block:sexual/minors",
    "block:violence/graphic",
    "block:harassment",
    "block:sexual,hate",
    '{"verdict":"allow","categories":[],"confidence":0.93}',
    "请审核这张视频关键帧截图。",
]
# Each with how Qwen's BPE cuts it (the colon merges with "self"; "violence" is two tokens)
VERDICT_PIECES = {
    "allow": ["allow"],
    "block:violence": ["block", ":", "viol", "ence"],
    "block:self-harm": ["block", ":self", "-h", "arm"],
    "block:sexual/minors": ["block", ":", "sexual", "/min", "ors"],
    "block:violence/graphic": ["block", ":", "viol", "ence", "/graph", "ic"],
}


@dataclass(frozen=True)
class Engine:
    """An engine whose tokenizer is Qwen2.5's BPE."""

    kind: str
    url: str
    model: str
    bpe: QwenBPE

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(f"{self.url}/tokenize", json={"model": self.model, **body}, timeout=60)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/v1/chat/completions", json={"model": self.model, **body}, timeout=300
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


@pytest.fixture(params=["simulator", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest, start_sim: SimFactory) -> Iterator[Engine]:
    if request.param == "simulator":
        url = start_sim("instant", time_scale=0.0, tokenizer=TINY_VLM_FAMILY).url
    else:
        url = request.getfixturevalue("real_engine_url")
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    return Engine(request.param, url, model, qwen_bpe(TINY_VLM_FAMILY))


@pytest.mark.parametrize("text", TEXTS)
def test_a_plain_prompt_is_tokenized_as_qwens_bpe_cuts_it(engine: Engine, text: str) -> None:
    answer = engine.tokenize({"prompt": text, "add_special_tokens": False})
    assert answer["tokens"] == engine.bpe.encode(text)
    assert answer["count"] == engine.bpe.count(text)


@pytest.mark.parametrize("verdict_format", ["compact", "json"])
def test_the_system_prompt_costs_the_same_tokens_on_the_engine(engine: Engine, verdict_format: str) -> None:
    text = load_system_prompt(prompt_version_for(verdict_format)).text  # type: ignore[arg-type]  # a format
    assert engine.tokenize({"prompt": text, "add_special_tokens": False})["count"] == engine.bpe.count(text)


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_the_chat_template_renders_to_qwens_tokens(engine: Engine, thinking: bool) -> None:
    system = load_system_prompt(prompt_version_for("compact")).text
    user = "请审核这张视频关键帧截图。"
    answer = engine.tokenize({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "chat_template_kwargs": {"enable_thinking": thinking},
    })  # fmt: skip
    rendered = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        + engine.bpe.generation_prompt(thinking)
    )
    assert answer["tokens"] == engine.bpe.encode(rendered)


@pytest.mark.parametrize("verdict", list(VERDICT_PIECES))
def test_a_verdict_is_generated_in_qwens_tokens_with_a_logprob_at_each(engine: Engine, verdict: str) -> None:
    system = load_system_prompt(prompt_version_for("compact")).text
    body = engine.chat({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "请审核。"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"choice": [verdict]},
        # The grammar allows any spelling of the choice ("b" "lock" too); a trained model writes the
        # canonical cut, the random tiny one is steered to it (the ids are Qwen's, so the bias names them)
        "logit_bias": {str(token): 100 for token in engine.bpe.encode(verdict)},
        "max_completion_tokens": 16,
        "logprobs": True,
        "top_logprobs": 3,
    })  # fmt: skip
    choice = body["choices"][0]
    assert choice["message"]["content"] == verdict
    entries = choice["logprobs"]["content"]
    # one logprob position per Qwen token of the verdict, then the stop token
    assert [entry["token"] for entry in entries] == [*VERDICT_PIECES[verdict], "<|im_end|>"]
    assert engine.bpe.pieces(verdict) == VERDICT_PIECES[verdict]
    assert body["usage"]["completion_tokens"] == engine.bpe.count(verdict) + 1
    # the gateway reads the action at the first token and each category along its real span
    (parsed,) = parse_engine_output(verdict, None, "stop").verdicts
    (read,) = with_confidence([parsed], [TokenLogprob.from_wire(e) for e in entries], verdict)
    assert read.confidence is not None, read.confidence_note
    if parsed.action == "block":
        assert read.category_scores is not None
        named = dict(read.category_scores)
        assert all(named[name] > 0 for name in parsed.categories), read.category_scores
