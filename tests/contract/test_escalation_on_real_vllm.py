"""An escalation's re-ask on the real vLLM: what it reuses of the first ask's prefill.

The re-ask sends the same system prompt, the same image (same ``uuid``) and the same user text as the fast
ask; only the chat template's end differs (thinking off closes an empty think block after the generation
prompt). vLLM hashes full blocks only (128 tokens on this CPU build), chained, images by their identity;
so the re-ask finds every full block of the shared part in the cache, and computes the rest.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

pytestmark = pytest.mark.vllm

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def escalate_everything(url: str) -> None:
    current = httpx.get(f"{url}/admin/thinking-policy", headers=ADMIN, timeout=10).json()
    body = {
        **current,
        "default_mode": "escalate",
        "escalation": {**current["escalation"], "threshold": 1.0},
        "reason": "every frame escalates: measure the re-ask",
    }
    response = httpx.put(f"{url}/admin/thinking-policy", json=body, headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text


def block_size(engine_url: str) -> int:
    text = httpx.get(f"{engine_url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info"):
            return int(line.split('block_size="')[1].split('"')[0])
    raise AssertionError("the engine exposes no vllm:cache_config_info")


@pytest.mark.parametrize("block_filling_prefix", [False, True], ids=["plain", "block-filling-prefix"])
def test_a_re_ask_reuses_every_full_block_of_the_fast_ask_s_prompt(
    real_engine_url: str, start_gateway: GatewayFactory, tmp_path: Path, block_filling_prefix: bool
) -> None:
    records = tmp_path / "records"
    gateway = start_gateway(
        engine_url=real_engine_url,
        quality={"records_dir": records},
        shaping={"verdict_cache_ttl_s": 0, "block_filling_prefix": block_filling_prefix},
    )
    escalate_everything(gateway.url)
    block = block_size(real_engine_url)
    frames = [make_keyframe("allow", 1280, 720, seed=7000 + i + 10 * block_filling_prefix) for i in range(3)]

    async def moderate() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=600) as http:
            answers = []
            for frame in frames:  # one at a time: nothing else fills the cache in between
                response = await http.post("/v1/moderations", json={"input": image_input(frame)})
                assert response.status_code == 200, response.text
                answers.append(response.json()["results"][0]["modgate"])
            return answers

    answers = asyncio.run(moderate())
    gateway.stop()  # the quality records are written in the background: drain them
    fast = {
        record["frame_sha256"]: record
        for path in records.glob("*.jsonl")
        for record in map(json.loads, path.read_text().splitlines())
        if record["arm"] == "thinking_off"
    }
    rows = []
    for details in answers:
        assert details["thinking_rule"] == "escalated", details
        first = fast[details["frame_sha256"]]
        # the fast ask is a fresh image: at most the system prompt's full blocks come from the cache
        shared_full_blocks = (min(first["prompt_tokens"], details["prompt_tokens"]) - 8) // block * block
        rows.append(
            (
                first["prompt_tokens"],
                first["cached_tokens"],
                details["prompt_tokens"],
                details["cached_tokens"],
            )
        )
        assert details["cached_tokens"] >= shared_full_blocks - block, rows
        assert details["cached_tokens"] > first["cached_tokens"], rows
        assert details["cached_tokens"] % block == 0
    print(f"\nblock {block}; (fast prompt, fast cached, re-ask prompt, re-ask cached): {rows}")
