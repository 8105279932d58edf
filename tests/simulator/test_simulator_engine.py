"""The simulator's own behaviour beyond the shared engine contract: scheduling, calibration inputs, oracle."""

from __future__ import annotations

import asyncio
import base64

import httpx

from deploy.keyframes import make_keyframe
from deploy.simulator.engine import PrefixCache
from deploy.simulator.tokenizer import Token
from tests.support import SimFactory


def chat(image: bytes, thinking: bool, model: str = "qwen3-vl-moe-sim") -> dict[str, object]:
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You moderate."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "check"},
                ],
            },
        ],
        "chat_template_kwargs": {"enable_thinking": thinking},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "v", "schema": {"type": "object"}},
        },
    }


def test_the_prefix_cache_hits_whole_blocks_and_never_the_last_token() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    tokens: list[Token] = [str(i) for i in range(12)]
    hashes = cache.block_hashes(tokens)
    assert len(hashes) == 3
    assert cache.lookup(hashes, 12) == 0
    assert cache.insert(hashes) == 12
    assert cache.lookup(hashes, 12) == 8  # 12 tokens: the last block holds the last token, recomputed
    assert cache.lookup(hashes, 13) == 12


def test_a_changed_early_token_invalidates_every_later_block() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=100)
    cache.insert(cache.block_hashes([str(i) for i in range(12)]))
    changed = cache.block_hashes(["x", *[str(i) for i in range(1, 12)]])
    assert cache.lookup(changed, 13) == 0


def test_the_oracle_reads_the_label_and_thinking_off_flips_the_configured_share(
    start_sim: SimFactory,
) -> None:
    sim = start_sim(thinking_off_disagreement=0.2)
    with httpx.Client(base_url=sim.url) as client:
        on = [
            client.post("/v1/chat/completions", json=chat(make_keyframe("block:hate", 160, 90, seed=s), True))
            for s in range(60)
        ]
        off = [
            client.post(
                "/v1/chat/completions", json=chat(make_keyframe("block:hate", 160, 90, seed=s), False)
            )
            for s in range(60)
        ]
    verdicts_on = [r.json()["choices"][0]["message"]["content"] for r in on]
    assert all('"verdict":"block"' in v and "hate" in v for v in verdicts_on)
    flipped = sum('"verdict":"allow"' in r.json()["choices"][0]["message"]["content"] for r in off)
    assert 3 <= flipped <= 25  # 20 % of 60 = 12, binomial spread


async def test_spark_pace_runs_eight_and_queues_the_rest(start_sim: SimFactory) -> None:
    sim = start_sim("spark", time_scale=0.01)
    frame = make_keyframe("allow", 640, 360)
    async with httpx.AsyncClient(base_url=sim.url, timeout=60) as client:
        results = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(frame, True)) for _ in range(12))
        )
        info = (await client.get("/sim/info")).json()
        metrics = (await client.get("/metrics")).text
    assert all(r.status_code == 200 for r in results)
    assert info["peak_running"] == 8
    assert 'vllm:num_requests_running{engine="0",model_name="qwen3-vl-moe-sim"} 0.0' in metrics


def test_tokenize_without_the_generation_prompt_counts_the_messages_alone(start_sim: SimFactory) -> None:
    sim = start_sim()
    messages = [{"role": "system", "content": "You moderate keyframes."}]
    with httpx.Client(base_url=sim.url) as client:

        def count(**extra: object) -> int:
            return int(client.post("/tokenize", json={"messages": messages, **extra}).json()["count"])

        bare = count(add_generation_prompt=False)
        # The assistant header (and, thinking off, its empty thinking block) goes only with the prompt.
        assert count(add_generation_prompt=False, chat_template_kwargs={"enable_thinking": True}) == bare
        assert count(add_generation_prompt=False, chat_template_kwargs={"enable_thinking": False}) == bare
        # Qwen's BPE: <|im_start|> assistant \n <think> \n (thinking on opens the block, as Qwen3.5's does)
        assert count() == bare + 5
        # ... and thinking off closes it at once: <think> \n\n </think> \n\n
        assert count(chat_template_kwargs={"enable_thinking": False}) == bare + 7
