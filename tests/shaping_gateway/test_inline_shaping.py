"""Where a keyframe is shaped: a request's lone frame that passes through on the event loop (its shaping is
a 1/8-scale decode, cheaper than the hand-off to a thread), everything else on the shaping threads; the
same checks and the same refusals either way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import gateway.moderation.frame_input as frame_input
from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.errors import ClientError
from gateway.moderation.frame_input import EncodedFrame, shape_frame
from gateway.moderation.shaping_pool import ShapingPool
from shaping.image import ImageLimits, ShapedImage
from shaping.tokens import TokenGrid
from tests.support import GatewayFactory, data_url, image_input

ON_GRID = make_keyframe("allow", 1088, 608, seed=1)
OFF_GRID = make_keyframe("allow", 1280, 720, seed=1)


@pytest.fixture
def pool() -> Iterator[ShapingPool]:
    pool = ShapingPool(2, thread_name_prefix="shaping")
    yield pool
    pool.shutdown()


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each ``shape_image`` call ran on."""
    names: list[str] = []
    shape = frame_input.shape_image

    def recording(*args: Any, **kwargs: Any) -> ShapedImage:
        names.append(threading.current_thread().name)
        return shape(*args, **kwargs)

    monkeypatch.setattr(frame_input, "shape_image", recording)
    return names


async def shaped(frame: frame_input.Frame, pool: ShapingPool, *, lone: bool) -> ShapedImage:
    return await shape_frame(frame, "tenant-a", executor=pool, limits=ImageLimits(), grid=TokenGrid(),
                             jpeg_quality=90, remote_images=None, lone=lone)


@pytest.mark.parametrize("as_bytes", [False, True], ids=["data-url", "held-bytes"])
async def test_a_lone_frame_that_passes_through_is_shaped_on_the_loop(
    pool: ShapingPool, threads: list[str], as_bytes: bool
) -> None:
    frame: frame_input.Frame = EncodedFrame(ON_GRID) if as_bytes else data_url(ON_GRID)
    result = await shaped(frame, pool, lone=True)
    assert result.passthrough
    assert threads == [threading.current_thread().name]


@pytest.mark.parametrize(
    ("frame", "lone"),
    [
        pytest.param(data_url(OFF_GRID), True, id="resized"),
        pytest.param(data_url(ON_GRID), False, id="one-of-several"),
        pytest.param(EncodedFrame(OFF_GRID), True, id="held-bytes-resized"),
    ],
)
async def test_any_other_frame_goes_to_a_shaping_thread(
    pool: ShapingPool, threads: list[str], frame: frame_input.Frame, lone: bool
) -> None:
    await shaped(frame, pool, lone=lone)
    assert len(threads) == 1
    assert threads[0].startswith("shaping")


async def test_a_frame_over_the_cap_goes_to_a_thread_even_if_it_passes_through(
    pool: ShapingPool, threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frame_input, "INLINE_MAX_BYTES", len(ON_GRID) - 1)
    assert (await shaped(data_url(ON_GRID), pool, lone=True)).passthrough
    assert threads[0].startswith("shaping")


async def test_a_damaged_lone_frame_is_refused_on_the_loop_as_on_a_thread(
    pool: ShapingPool, threads: list[str]
) -> None:
    cut = ON_GRID[: len(ON_GRID) * 9 // 10]
    errors = []
    for lone in (True, False):
        with pytest.raises(ClientError) as refused:
            await shaped(data_url(cut), pool, lone=lone)
        errors.append((type(refused.value), refused.value.code, str(refused.value)))
    assert errors[0] == errors[1]
    assert "truncated" in errors[0][2]
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("shaping")


def test_through_the_gateway_only_a_requests_lone_frame_stays_on_the_loop(
    sim: ThreadedServer, start_gateway: GatewayFactory, threads: list[str]
) -> None:
    gateway = start_gateway(engine={"url": sim.url})
    for frames in ([ON_GRID], [ON_GRID, make_keyframe("allow", 1088, 608, seed=2)]):
        body = {"model": "m", "input": image_input(*frames)}
        response = httpx.post(f"{gateway.url}/v1/moderations", json=body,
                              headers={"X-Modgate-Thinking": "off"}, timeout=60)
        assert response.status_code == 200, response.text
    lone, *pair = threads
    assert not lone.startswith("shaping")
    assert len(pair) == 2
    assert all(name.startswith("shaping") for name in pair)
