"""Token accounting: each request's prompt tokens predicted, compared with the engine's usage afterwards."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.errors import UpstreamError
from gateway.http.app import create_app
from gateway.moderation.token_prediction import PromptTokenCheck
from gateway.series.metrics import GatewayMetrics
from gateway.settings import Settings
from shaping.accounting import Measurement, PromptPrediction, TokenAccountant, compare_usage
from shaping.prompt import load_system_prompt
from tests.support import GatewayFactory, SimFactory, forward, image_input


@dataclass(frozen=True)
class Frame:
    """What the accountant reads of a shaped keyframe."""

    data_url: str = "data:image/jpeg;base64,AAAA"
    sha256: str = "f" * 64
    image_tokens: int = 646


def counter(gateway: ThreadedServer, name: str) -> float:
    """A counter's value on the gateway's /metrics."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    raise AssertionError(f"{name} is not on /metrics")


def post(gateway: ThreadedServer, body: dict[str, Any], thinking: str = "on") -> dict[str, Any]:
    response = httpx.post(
        f"{gateway.url}/v1/moderations",
        json={"model": "m", **body},
        timeout=60,
        headers={"X-Modgate-Thinking": thinking},
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


# --- the accountant, alone -------------------------------------------------------------------------------


def test_the_accountant_asks_for_the_scaffold_and_the_text_then_the_image_overhead() -> None:
    accountant = TokenAccountant("system prompt", "model-a")
    first = accountant.pending(True, "请审核", [Frame()])
    assert [m.kind for m in first] == ["scaffold", "text"]
    scaffold, text = first
    assert scaffold.body["messages"][0] == {"role": "system", "content": "system prompt"}
    assert scaffold.body["messages"][1]["content"] == [{"type": "text", "text": ""}]
    assert scaffold.body["chat_template_kwargs"] == {"enable_thinking": True}
    assert text.body == {"model": "model-a", "prompt": "请审核", "add_special_tokens": False}
    accountant.record(scaffold, 390)
    accountant.record(text, 5)
    (image,) = accountant.pending(True, "请审核", [Frame()])
    assert image.kind == "image_overhead"
    assert image.body["messages"][1]["content"][0]["uuid"] == "f" * 64
    accountant.record(image, 390 + 646 + 2)
    assert accountant.pending(True, "请审核", [Frame(), Frame()]) == []
    assert accountant.predict(True, "请审核", [Frame(), Frame()]) == PromptPrediction(390, 5, 1292, 4)


def test_each_thinking_mode_has_its_own_scaffold() -> None:
    accountant = TokenAccountant("s", "m")
    accountant.record(Measurement("scaffold", "on", {}), 400)
    assert accountant.predict(True, "", []) == PromptPrediction(400, 0, 0, 0)
    assert accountant.predict(False, "", []) is None
    assert [m.key for m in accountant.pending(False, "", [])] == ["off"]


def test_a_prediction_the_engine_agrees_with_is_no_mismatch() -> None:
    predicted = PromptPrediction(scaffold=390, text=5, image=646, image_overhead=2)
    assert compare_usage(predicted, prompt_tokens=1043, image_tokens=646) is None
    assert compare_usage(predicted, prompt_tokens=1043, image_tokens=0) is None  # an older server: no detail
    assert compare_usage(predicted, prompt_tokens=0, image_tokens=0) is None  # no usage at all


def test_a_wrong_image_count_is_a_mismatch_even_when_the_total_agrees() -> None:
    predicted = PromptPrediction(scaffold=390, text=5, image=60, image_overhead=23)
    mismatch = compare_usage(predicted, prompt_tokens=478, image_tokens=83)
    assert mismatch is not None
    assert mismatch.difference == 0
    assert "image tokens predicted 60, engine counted 83" in mismatch.describe()


def test_a_mismatch_says_each_part_and_the_difference() -> None:
    mismatch = compare_usage(PromptPrediction(390, 5, 646, 2), prompt_tokens=1050, image_tokens=646)
    assert mismatch is not None
    assert mismatch.describe() == (
        "prompt tokens: predicted 1,043 (scaffold 390 + text 5 + image 646 + image overhead 2), "
        "engine counted 1,050 (+7)"
    )


# --- through the gateway, against the simulator ----------------------------------------------------------


def test_predictions_match_the_simulator_for_every_request_shape(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    engine = start_sim("instant")
    gateway = start_gateway(engine={"url": engine.url}, shaping={"packing_k": 2})
    frames = [make_keyframe("allow", 640, 360, seed=seed) for seed in range(1, 4)]
    post(gateway, {"input": image_input(frames[0])}, thinking="on")
    post(gateway, {"input": image_input(frames[1])}, thinking="off")
    caption = {"type": "text", "text": "caption: 街头"}
    post(gateway, {"input": [*image_input(*frames), caption]})  # packed 2 + 1, with caller text
    post(gateway, {"input": "a text only request"})
    assert counter(gateway, "modgate_prompt_tokens") > 0
    # Every engine request was predicted and compared (one each; the packed three are two requests):
    # no mismatch means something only when predictions were made.
    assert counter(gateway, "modgate_token_predictions") == 5
    assert counter(gateway, "modgate_token_prediction_mismatches") == 0


def test_an_engine_that_counts_other_image_tokens_is_counted_and_logged(
    start_sim: SimFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = start_sim("instant")  # 32×32 pixels per token
    gateway = start_gateway(engine={"url": engine.url}, shaping={"pixels_per_token": 28})  # shapes for 28×28
    with caplog.at_level(logging.WARNING, logger="modgate.moderation"):
        post(gateway, {"input": image_input(make_keyframe("allow", 1280, 720, seed=5))})
        post(gateway, {"input": image_input(make_keyframe("allow", 1280, 720, seed=6))})
    assert counter(gateway, "modgate_token_predictions") == 2
    assert counter(gateway, "modgate_token_prediction_mismatches") == 2
    messages = [r.getMessage() for r in caplog.records if "token prediction mismatch" in r.getMessage()]
    assert len(messages) == 2
    assert "image tokens predicted" in messages[0]


def test_on_llamacpp_images_are_not_predicted_said_once_at_start_and_text_still_is(
    start_sim: SimFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # llama.cpp's /tokenize takes text only: a request with images cannot be predicted there. Said once, when
    # the gateway starts, not as a failed /tokenize that pauses every prediction (text ones too) for 60 s.
    engine = start_sim("instant", kind="llamacpp", vision=True)
    with caplog.at_level(logging.WARNING, logger="modgate.moderation"):
        gateway = start_gateway(engine={"url": engine.url})
        said_at_start = [r.getMessage() for r in caplog.records if "token prediction" in r.getMessage()]
        for seed in (1, 2):
            post(gateway, {"input": image_input(make_keyframe("allow", 640, 360, seed=seed))})
        post(gateway, {"input": "a text only request"})
    said = [r.getMessage() for r in caplog.records if "token prediction" in r.getMessage()]
    assert len(said_at_start) == 1, said_at_start
    assert "off for requests with images" in said_at_start[0]
    assert engine.url in said_at_start[0]
    assert said == said_at_start  # nothing more: no pause, no mismatch
    assert counter(gateway, "modgate_token_predictions") == 1  # the text request, predicted and compared
    assert counter(gateway, "modgate_token_prediction_mismatches") == 0


@pytest.fixture
def engine_without_tokenize(start_sim: SimFactory) -> Iterator[ThreadedServer]:
    """A gateway whose engine answers everything but /tokenize (404), as some servers do."""
    engine = start_sim("instant")

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(
                404,
                json={"error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}},
            )
        return await forward(request, engine.url)

    app = create_app(Settings(), engine_transport=httpx.MockTransport(handler))
    with ThreadedServer(app) as gateway:
        yield gateway


def test_a_failing_tokenize_never_fails_a_moderation(engine_without_tokenize: ThreadedServer) -> None:
    frame = make_keyframe("block:hate", 640, 360, seed=2)
    answer = post(engine_without_tokenize, {"input": image_input(frame)})
    assert answer["results"][0]["modgate"]["action"] == "block"
    assert counter(engine_without_tokenize, "modgate_token_predictions") == 0  # nothing to predict with
    assert counter(engine_without_tokenize, "modgate_token_prediction_mismatches") == 0


# --- the gateway's check: one accountant per served model --------------------------------------------------


class CountingPool:
    """Answers /tokenize with a fixed count per kind of body and keeps the model each body named."""

    def __init__(self) -> None:
        self.models: list[str] = []

    def engines_counting_no_images(self) -> list[str]:
        return []  # a vLLM-like engine: its /tokenize counts images

    async def tokenize(self, body: dict[str, Any], *, models: Mapping[str, str] | None = None) -> int:
        self.models.append(body["model"])
        return 100 if "messages" in body and len(body["messages"][-1]["content"]) > 1 else 40


def test_an_engine_back_with_another_model_is_measured_afresh_under_its_own_name() -> None:
    served = ["tiny-vlm-a"]

    async def engine_model() -> str:
        return served[0]

    pool = CountingPool()
    check = PromptTokenCheck({"compact": load_system_prompt("v2")}, pool, engine_model, GatewayMetrics())  # type: ignore[arg-type]  # a fake pool: only tokenize
    frames = [Frame()]

    async def predict() -> PromptPrediction | None:
        return await check.predict(frames, "", False, "compact")  # type: ignore[arg-type]  # Frame reads as ShapedImage

    first = asyncio.run(predict())
    assert first is not None
    assert set(pool.models) == {"tiny-vlm-a"}
    measured = len(pool.models)
    asyncio.run(predict())
    assert len(pool.models) == measured  # the same model: nothing measured again
    served[0] = "tiny-vlm-b"
    asyncio.run(predict())
    assert len(pool.models) > measured
    assert set(pool.models[measured:]) == {"tiny-vlm-b"}


class RefusingPool:
    """A /tokenize that refuses every body (a server without one), counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def engines_counting_no_images(self) -> list[str]:
        return []  # it says it counts images; its /tokenize fails

    async def tokenize(self, body: dict[str, Any], *, models: Mapping[str, str] | None = None) -> int:
        self.calls += 1
        await asyncio.sleep(0.01)  # the others queue on the lock meanwhile
        raise UpstreamError("engine /tokenize answered 404: Not Found")


def test_requests_waiting_on_a_tokenize_that_fails_do_not_each_ask_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def engine_model() -> str:
        return "tiny"

    pool = RefusingPool()
    check = PromptTokenCheck({"compact": load_system_prompt("v2")}, pool, engine_model, GatewayMetrics())  # type: ignore[arg-type]  # a fake pool: only tokenize

    async def burst() -> list[PromptPrediction | None]:
        frames = [Frame()]
        return await asyncio.gather(*(check.predict(frames, "", False, "compact") for _ in range(8)))  # type: ignore[arg-type]  # Frame reads as ShapedImage

    with caplog.at_level(logging.WARNING, logger="modgate.moderation"):
        assert asyncio.run(burst()) == [None] * 8
    assert pool.calls == 1  # the first failure paused prediction for all eight
    assert sum("token prediction paused" in record.getMessage() for record in caplog.records) == 1
