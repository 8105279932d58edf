"""Where a keyframe is shaped: a request's lone frame that passes through on the event loop (its shaping is
a 1/8-scale decode, cheaper than the hand-off to a thread), its decode alone on a shaping thread while the
gateway is busy with other requests, everything else on the shaping threads; the same checks and the same
refusals either way."""

from __future__ import annotations

import asyncio
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
from shaping.image import ImageLimits, Passthrough, ShapedImage
from shaping.tokens import TokenGrid
from tests.support import GatewayFactory, SimFactory, data_url, image_input

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


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each passed-through frame's decode ran on."""
    names: list[str] = []
    decode = Passthrough.decode

    def recording(self: Passthrough) -> None:
        names.append(threading.current_thread().name)
        decode(self)

    monkeypatch.setattr(Passthrough, "decode", recording)
    return names


async def shaped(
    frame: frame_input.Frame, pool: ShapingPool, *, lone: bool, busy: bool = False
) -> ShapedImage:
    return await shape_frame(frame, "tenant-a", executor=pool, limits=ImageLimits(), grid=TokenGrid(),
                             jpeg_quality=90, remote_images=None, lone=lone, busy=busy)


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


@pytest.mark.parametrize("as_bytes", [False, True], ids=["data-url", "held-bytes"])
async def test_while_busy_only_the_decode_of_a_lone_frame_goes_to_a_thread(
    pool: ShapingPool, threads: list[str], decodes: list[str], as_bytes: bool
) -> None:
    frame: frame_input.Frame = EncodedFrame(ON_GRID) if as_bytes else data_url(ON_GRID)
    idle, busy = await shaped(frame, pool, lone=True), await shaped(frame, pool, lone=True, busy=True)
    assert threads == [threading.current_thread().name]  # the idle one; the busy one is not shaped in full
    assert decodes[0] == threading.current_thread().name
    assert decodes[1].startswith("shaping")
    assert busy == idle
    assert busy.data_url == idle.data_url


async def test_while_busy_a_damaged_lone_frame_is_refused_as_when_idle(pool: ShapingPool) -> None:
    cut = data_url(ON_GRID[: len(ON_GRID) * 9 // 10])
    errors = []
    for busy in (False, True):
        with pytest.raises(ClientError) as refused:
            await shaped(cut, pool, lone=True, busy=busy)
        errors.append((type(refused.value), refused.value.code, str(refused.value)))
    assert errors[0] == errors[1]


async def test_while_busy_a_frame_whose_first_bytes_misled_is_shaped_in_full_on_a_thread(
    pool: ShapingPool, threads: list[str], decodes: list[str]
) -> None:
    # an Adobe segment after the frame header: the first bytes say "passes through", the whole file not
    adobe = b"Adobe" + (100).to_bytes(2, "big") + bytes(4) + b"\x01"
    sof = ON_GRID.index(b"\xff\xc0")
    end = sof + 2 + int.from_bytes(ON_GRID[sof + 2 : sof + 4], "big")
    misled = ON_GRID[:end] + b"\xff\xee" + (len(adobe) + 2).to_bytes(2, "big") + adobe + ON_GRID[end:]
    assert frame_input.passes_through(misled[:6144], TokenGrid())
    result = await shaped(data_url(misled), pool, lone=True, busy=True)
    assert not result.passthrough
    assert (result.width, result.height) == (1088, 608)
    assert decodes == []
    assert len(threads) == 1
    assert threads[0].startswith("shaping")


def test_a_gateway_busy_with_another_request_decodes_a_lone_frame_on_a_thread(
    start_sim: SimFactory, start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    decodes: list[str] = []
    first_checked = threading.Event()
    decode = Passthrough.decode

    def recording(self: Passthrough) -> None:
        decodes.append(threading.current_thread().name)
        decode(self)
        first_checked.set()

    monkeypatch.setattr(Passthrough, "decode", recording)
    sim = start_sim("spark", time_scale=1.0)  # an engine call of real length: the first is still in flight
    gateway = start_gateway(engine={"url": sim.url})

    async def two() -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60,
                                     headers={"X-Modgate-Thinking": "off"}) as client:
            frames = [ON_GRID, make_keyframe("allow", 1088, 608, seed=2)]
            bodies = [{"model": "m", "input": image_input(frame)} for frame in frames]
            first = asyncio.create_task(client.post("/v1/moderations", json=bodies[0]))
            assert await asyncio.to_thread(first_checked.wait, 30)  # its engine call under way
            second = await client.post("/v1/moderations", json=bodies[1])
            assert second.status_code == 200, second.text
            assert (await first).status_code == 200

    asyncio.run(two())
    assert len(decodes) == 2
    assert not decodes[0].startswith("shaping")
    assert decodes[1].startswith("shaping")
