"""Shadow pairs on a live pool of both kinds: each record names the kind of the engine that answered it, and
each shadow request names that engine's own model (vLLM refuses a llama.cpp alias with a 404)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.keyframes import make_keyframe
from tests.shadow.test_shadow_pairs import post_frames, read_records, set_shadow_share, shadow_counts
from tests.support import GatewayFactory, SwappableEngine


async def test_shadow_pairs_on_a_mixed_pool_name_each_engine_and_its_own_model(
    mixed: tuple[SwappableEngine, SwappableEngine],
    start_gateway: GatewayFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vllm, llamacpp = mixed
    llamacpp.swap(model="qwen3-vl-gguf-alias")  # llama.cpp listed first, under its own alias
    gateway = start_gateway(
        engine={"model_recheck_s": 3600, "url": f"{llamacpp.url},{vllm.url}"},
        quality={"records_dir": str(tmp_path)}, shaping={"verdict_cache_ttl_s": 0},
    )
    set_shadow_share(gateway, 1.0)
    first = make_keyframe("block:violence", 256, 144, seed=901)
    await post_frames(gateway, [first], concurrency=1)
    on_llamacpp = await read_records(tmp_path, expected=2)
    assert llamacpp.used()  # both idle: the engine listed first took the live call
    live = [r for r in on_llamacpp if r.arm == "thinking_on"]
    assert [r.engine for r in live] == ["llamacpp"]  # the live verdict is llama.cpp's, and says so

    llamacpp.stop()  # from now on only vLLM can judge, live and shadow, under vLLM's own model id
    second = make_keyframe("allow", 256, 144, seed=902)
    await post_frames(gateway, [second], concurrency=1)
    records = await read_records(tmp_path, expected=4)
    on_vllm = [r for r in records if r.frame_sha256 not in {x.frame_sha256 for x in on_llamacpp}]
    assert sorted(r.arm for r in on_vllm) == ["thinking_off", "thinking_on"]
    assert {r.engine for r in on_vllm} == {"vllm"}
    assert vllm.used()
    assert shadow_counts(gateway).get("engine_error", 0) == 0  # no shadow request named the alias to vLLM
    # nor did token prediction ask vLLM's /tokenize under the alias (a 404 pauses it for a minute)
    assert not [r.message for r in caplog.records if "token prediction paused" in r.message]
