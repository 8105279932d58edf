"""An escalation's re-ask on the real vLLM: what it reuses of the first ask's prefill.

The re-ask sends the same system prompt, the same image (same ``uuid``) and the same user text as the fast
ask; only the chat template's end differs (thinking off closes an empty think block after the generation
prompt: ``<think>\\n\\n</think>\\n\\n``; thinking on opens one: ``<think>\\n``, 2 tokens). vLLM hashes full
blocks only (128 tokens on this CPU build), chained, image blocks with the image's identity, and always
recomputes the last prompt token. So the re-ask finds every full block of the part both asks share, the
thinking-on prompt but its last 2 tokens: ``floor((n_on - 2) / 128) * 128`` tokens. Whether that is more
than any request gets depends on where the frame ends: a block that holds the image and is not full by the
end of the shared part was never stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.keyframes import make_keyframe
from tests.support import ADMIN_TOKEN, GatewayFactory, data_url

pytestmark = pytest.mark.vllm

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
THINKING_ON_TAIL = 2  # "<think>\n" after the generation prompt: the only tokens the fast ask did not have
# caller text sent with the frame: it follows the image, so it fills the image's block (about 150 tokens)
CALLER_TEXT = "上传者备注：" + "这是一段直播回放的截图，请结合画面中的人物、动作和文字判断。" * 6


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


def moderate(url: str, frame: bytes, text: str | None = None, thinking: str | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(frame)}}]
    if text:
        parts.append({"type": "text", "text": text})
    headers = {"X-Modgate-Thinking": thinking} if thinking else {}
    response = httpx.post(f"{url}/v1/moderations", json={"input": parts}, headers=headers, timeout=600)
    assert response.status_code == 200, response.text
    details: dict[str, Any] = response.json()["results"][0]["modgate"]
    return details


@pytest.mark.parametrize("block_filling_prefix", [False, True], ids=["plain", "block-filling-prefix"])
def test_a_lone_frame_s_re_ask_reuses_what_any_request_does(
    real_engine_url: str, start_gateway: GatewayFactory, tmp_path: Path, block_filling_prefix: bool
) -> None:
    records = tmp_path / "records"
    gateway = start_gateway(
        engine={"url": real_engine_url},
        quality={"records_dir": records},
        shaping={"verdict_cache_ttl_s": 0, "block_filling_prefix": block_filling_prefix},
    )
    escalate_everything(gateway.url)
    block = block_size(real_engine_url)
    frames = [make_keyframe("allow", 1280, 720, seed=7000 + i + 10 * block_filling_prefix) for i in range(3)]
    answers = [moderate(gateway.url, frame) for frame in frames]  # one at a time
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
        rows.append(
            (
                first["prompt_tokens"],
                first["cached_tokens"],
                details["prompt_tokens"],
                details["cached_tokens"],
            )
        )
        shared_blocks = (details["prompt_tokens"] - THINKING_ON_TAIL) // block * block
        assert details["cached_tokens"] == shared_blocks, rows
    # a new frame's fast ask reuses only the blocks before its image; its re-ask reuses every full block, the
    # image's included when the prompt reaches past it (the compact prompt puts this engine's 466-token
    # request's frame in its third 128-token block: fast asks 256 cached, re-asks 384)
    for _, fast_cached, _, reask_cached in rows[1:]:
        assert reask_cached >= fast_cached, rows
    print(
        f"\nblock {block}, block-filling prefix {block_filling_prefix}; "
        f"(fast prompt, fast cached, re-ask prompt, re-ask cached): {rows}"
    )


def test_a_re_ask_reuses_the_image_s_blocks_once_they_are_full(
    real_engine_url: str, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine={"url": real_engine_url}, shaping={"verdict_cache_ttl_s": 0})
    escalate_everything(gateway.url)
    block = block_size(real_engine_url)
    frame, other = (make_keyframe("allow", 1280, 720, seed=seed) for seed in (7100, 7101))
    moderate(gateway.url, other, CALLER_TEXT, thinking="off")  # the system prompt and the text's template
    escalated = moderate(gateway.url, frame, CALLER_TEXT)
    fresh = moderate(gateway.url, make_keyframe("allow", 1280, 720, seed=7102), CALLER_TEXT, thinking="off")
    assert escalated["thinking_rule"] == "escalated"
    shared_blocks = (escalated["prompt_tokens"] - THINKING_ON_TAIL) // block * block
    assert escalated["cached_tokens"] == shared_blocks
    # a fast ask of a new frame stops at the block where its image starts; the re-ask goes past it
    assert escalated["cached_tokens"] > fresh["cached_tokens"]
    print(
        f"\nblock {block}; with {len(CALLER_TEXT)} characters of caller text: re-ask prompt "
        f"{escalated['prompt_tokens']}, cached {escalated['cached_tokens']}; a new frame's fast ask: prompt "
        f"{fresh['prompt_tokens']}, cached {fresh['cached_tokens']}"
    )
