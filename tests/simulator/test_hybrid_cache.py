"""The simulator's hybrid-model cache law (vLLM's "align" mode), as the real hybrid engine showed it."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deploy.simulator.engine import HybridPrefixCache
from deploy.simulator.presets import PRESETS
from deploy.simulator.tokenizer import Token
from tests.support import SimFactory

SYSTEM = "你是内容审核员。" + "请依据平台规则判断内容是否违规，并只输出判定。" * 30


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _ids(client: httpx.Client, user: str) -> list[int]:
    body = {"model": "tiny", "messages": _messages(user), "chat_template_kwargs": {"enable_thinking": False}}
    return list(client.post("/tokenize", json=body).json()["tokens"])


def _shared(client: httpx.Client) -> list[int]:
    first, second = _ids(client, "A"), _ids(client, "B")
    length = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    return first[:length]


def _cached(client: httpx.Client, user: str) -> int:
    body = {"model": "tiny", "messages": _messages(user), "max_tokens": 4,
            "chat_template_kwargs": {"enable_thinking": False}}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def _users(count: int) -> list[str]:
    return [f"第{i}条：" + "这是一段需要审核的用户文本，内容各不相同。" * 25 + str(i) for i in range(count)]


def test_a_state_is_kept_at_block_boundaries_and_the_tail_unit_only() -> None:
    cache = HybridPrefixCache(block_size=8, capacity_blocks=100, unit=2)
    prompt: list[Token] = list(range(13))
    hashes = cache.block_hashes(prompt)
    assert len(hashes) == 6  # units up to 12, the last one before the last token
    cache.insert(hashes)
    assert cache.lookup(cache.block_hashes([*range(12), 99]), 13) == 12  # the tail state
    assert cache.lookup(cache.block_hashes([*range(11), 99, 98]), 13) == 8  # the block boundary
    assert cache.lookup(cache.block_hashes([*range(7), 99, 98]), 9) == 0  # no state at 2, 4 or 6


def test_shared_prefix_under_a_block_never_hits_without_a_match_unit(start_sim: SimFactory) -> None:
    sim = start_sim("hybrid-cpu")
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        users = _users(3)
        assert [_cached(client, user) for user in [*users, users[0], users[0]]] == [0] * 5


def test_a_priming_request_makes_every_later_request_hit_the_shared_prefix(start_sim: SimFactory) -> None:
    sim = start_sim("hybrid-cpu", prefix_match_unit=16)
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        shared = _shared(client)
        users = _users(4)
        assert [_cached(client, user) for user in users[:2]] == [0, 0]  # unprimed: no state at the junction
        primer = client.post("/v1/completions", json={"model": "tiny", "prompt": [*shared, shared[-1]],
                                                      "max_tokens": 1})
        assert primer.status_code == 200, primer.text
        expected = len(shared) // 16 * 16
        assert expected > 0
        assert [_cached(client, user) for user in users[2:]] == [expected, expected]
        client.post("/sim/reset_prefix_cache")  # eviction or a restart: the state is gone
        assert _cached(client, users[0]) == 0


def test_a_shared_prefix_of_a_whole_block_hits_without_priming(start_sim: SimFactory) -> None:
    sim = start_sim("hybrid-cpu", block_size=64)
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        shared = len(_shared(client))
        cached = [_cached(client, user) for user in _users(3)]
    assert cached == [0, shared // 64 * 64, shared // 64 * 64]


def test_the_cache_config_shows_the_labels_the_real_engine_does(start_sim: SimFactory) -> None:
    sim = start_sim("hybrid-cpu", prefix_match_unit=16)
    text = httpx.get(f"{sim.url}/metrics", timeout=10).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info")
    labels = family.samples[0].labels
    assert labels["block_size"] == "2176"
    assert labels["prefix_match_unit"] == "16"
    assert labels["mamba_cache_mode"] == "align"
    assert labels["enable_mamba_shared_prefix_checkpoint"] == "False"


@pytest.mark.parametrize(("changes", "words"), [
    ({"prefix_match_unit": 100}, "must be divisible by prefix_match_unit"),
    ({"mamba_cache_mode": "none", "prefix_match_unit": 16}, "with a single KV cache group"),
])
def test_an_invalid_match_unit_is_refused_as_vllm_refuses_it(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        PRESETS["hybrid-cpu"].scaled(**changes)
