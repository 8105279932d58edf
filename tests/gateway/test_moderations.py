"""POST /v1/moderations through the official ``openai`` client and plain HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from shaping.verdict import compact_regex
from tests.support import GatewayFactory, SimFactory, image_input


def moderate(gateway: ThreadedServer, api_key: str = "unused", **kwargs: Any) -> Any:
    """``client.moderations.create(**kwargs)`` with the official client, closed afterwards."""
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0) as client:
        return client.moderations.create(**kwargs)


def test_the_openai_client_gets_one_result_per_image(gateway: ThreadedServer) -> None:
    frames = [make_keyframe("block:violence", 640, 360, seed=1), make_keyframe("allow", 640, 360, seed=2)]
    response = moderate(gateway, model="modgate-moderation", input=image_input(*frames))
    assert response.id.startswith("modr-")
    assert response.model == "modgate-moderation"
    blocked, allowed = response.results
    assert blocked.flagged
    assert blocked.categories.violence
    assert blocked.category_scores.violence > 0.5
    assert blocked.category_applied_input_types.violence == ["image"]
    assert not allowed.flagged
    assert not any(allowed.categories.model_dump().values())


def test_each_result_carries_the_project_field(gateway: ThreadedServer) -> None:
    response = moderate(
        gateway, model="modgate-moderation", input=image_input(make_keyframe("review", 640, 360, seed=3))
    )
    details = response.results[0].model_extra["modgate"]
    assert details["action"] == "review"
    assert details["thinking"] == "on"
    assert details["thinking_rule"] == "default"
    assert details["policy_version"] == 1
    assert details["latency_ms"] > 0
    assert details["cached_tokens"] >= 0
    assert details["prompt_tokens"] > details["image_tokens"] > 0
    assert details["reasoning_tokens"] > 0
    assert len(details["frame_sha256"]) == 64


def test_a_caller_can_ask_for_thinking_off(gateway: ThreadedServer) -> None:
    response = moderate(
        gateway,
        model="modgate-moderation",
        input=image_input(make_keyframe("allow", 640, 360, seed=4)),
        extra_headers={"X-Modgate-Thinking": "off"},
    )
    details = response.results[0].model_extra["modgate"]
    assert (details["thinking"], details["thinking_rule"]) == ("off", "caller")
    assert details["reasoning_tokens"] == 0


def test_a_text_only_input_gets_one_text_result(gateway: ThreadedServer) -> None:
    response = moderate(gateway, model="modgate-moderation", input="hello there")
    (result,) = response.results
    assert result.category_applied_input_types.violence == ["text"]
    assert result.model_extra["modgate"]["frame_sha256"] is None


def test_listed_keys_are_required_when_configured(start_gateway: GatewayFactory, sim: ThreadedServer) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys="k-alpha:tenant-a,k-beta:tenant-b")
    body = image_input(make_keyframe("allow", 320, 180))
    with pytest.raises(openai.AuthenticationError) as missing:
        moderate(gateway, api_key="wrong", model="m", input=body)
    assert missing.value.status_code == 401
    assert missing.value.body["code"] == "invalid_api_key"  # type: ignore[index]  # a JSON object
    assert moderate(gateway, api_key="k-beta", model="m", input=body).results


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/moderations", b'{"input": 5}'),
        ("POST", "/v1/moderations", b"{not json"),
        ("POST", "/v1/moderations", b'{"input": ' + b"[" * 100 + b"]" * 100 + b"}"),
        ("POST", "/v1/videos/v1/keyframes", b'{"frames": []}'),
        ("POST", "/v1/jobs", b"{}"),
        ("POST", "/admin/thinking-policy/rollback", b'{"surprise": 1}'),
    ],
)
def test_a_caller_without_a_key_gets_401_before_its_body_is_read(
    start_gateway: GatewayFactory, sim: ThreadedServer, method: str, path: str, body: bytes
) -> None:
    gateway = start_gateway(engine_url=sim.url, api_keys="k-alpha:tenant-a")
    response = httpx.request(method, f"{gateway.url}{path}", content=body,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 401, response.text  # not the 400 the body would get
    assert response.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "json"),
        (b'{"input": 5}', 400, "input"),
        (b'{"input": [{"type": "video", "url": "x"}]}', 400, "input"),
        (b'{"input": "x", "surprise": 1}', 400, "surprise"),
        (
            b'{"input": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,@@@"}}]}',
            400,
            "base64",
        ),
        (
            b'{"input": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,aGVsbG8="}}]}',
            415,
            "",
        ),
    ],
)
def test_bad_requests_get_a_4xx_in_the_openai_error_shape(
    gateway: ThreadedServer, body: bytes, status: int, fragment: str
) -> None:
    response = httpx.post(
        f"{gateway.url}/v1/moderations", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment.lower() in error["message"].lower()
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200  # and the service stays up


def test_unparsable_engine_output_becomes_review_and_is_counted(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim(faults=Faults(malformed_rate=1.0))
    gateway = start_gateway(engine_url=sim.url)
    response = moderate(gateway, model="m", input=image_input(make_keyframe("block:hate", 320, 180)))
    details = response.results[0].model_extra["modgate"]
    assert details["action"] == "review"
    assert "not JSON" in details["reason"]
    assert details["confidence"] is None
    assert details["confidence_reason"] == "the verdict could not be parsed"
    assert response.results[0].flagged
    metrics = httpx.get(f"{gateway.url}/metrics").text
    samples = {
        (s.name, s.labels.get("problem")): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    assert samples[("modgate_unparsable_outputs_total", "invalid_json")] == 1


def test_the_confidence_is_the_engines_probability_of_the_action(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim()
    gateway = start_gateway(engine_url=sim.url)
    frame = make_keyframe("block:hate", 320, 180, seed=5)
    response = moderate(
        gateway, model="m", input=image_input(frame), extra_headers={"X-Modgate-Thinking": "off"}
    )
    result = response.results[0]
    details = result.model_extra["modgate"]
    # the simulator's own ground truth for this frame, by the identity the gateway gave it (shaped SHA-256)
    truth = httpx.post(
        f"{sim.url}/sim/truth",
        json={"url": image_input(frame)[0]["image_url"]["url"], "uuid": details["frame_sha256"]},
    ).json()
    assert details["verdict_format"] == "compact"
    assert details["confidence"] == pytest.approx(truth["confidence_off"], abs=1e-3)
    assert details["confidence_reason"] is None
    if details["action"] == "block":  # the category's score comes from the same logprobs
        assert 0 < result.category_scores.hate <= details["confidence"]
        assert result.category_scores.sexual < result.category_scores.hate


def test_a_caller_may_ask_for_the_json_verdict_and_it_costs_more_tokens(gateway: ThreadedServer) -> None:
    frame = image_input(make_keyframe("allow", 320, 180, seed=6))
    answers = {
        verdict_format: moderate(
            gateway,
            model="m",
            input=frame,
            extra_headers={"X-Modgate-Thinking": "off"},
            extra_body={"modgate": {"verdict_format": verdict_format}},
        )
        .results[0]
        .model_extra["modgate"]
        for verdict_format in ("compact", "json")
    }
    assert {f: a["verdict_format"] for f, a in answers.items()} == {"compact": "compact", "json": "json"}
    assert answers["compact"]["action"] == answers["json"]["action"] == "allow"
    assert answers["json"]["reused"] is None  # the format is part of the reuse scope: asked again
    assert answers["compact"]["completion_tokens"] == 2  # "allow" and the stop token
    assert answers["json"]["completion_tokens"] > 12  # 16 of Qwen's tokens and the stop token
    assert answers["json"]["confidence"] == pytest.approx(answers["compact"]["confidence"])


def test_without_logprobs_the_confidence_is_null_and_the_answer_says_why(
    sim: ThreadedServer, start_gateway: GatewayFactory
) -> None:
    gateway = start_gateway(engine_url=sim.url, engine={"top_logprobs": 0})
    response = moderate(gateway, model="m", input=image_input(make_keyframe("allow", 320, 180, seed=7)))
    details = response.results[0].model_extra["modgate"]
    assert details["confidence"] is None
    assert "TOP_LOGPROBS=0" in details["confidence_reason"]


def test_healthz_and_readyz(gateway: ThreadedServer) -> None:
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


def test_readyz_is_503_while_the_engine_is_down(start_gateway: GatewayFactory) -> None:
    gateway = start_gateway(engine_url="http://127.0.0.1:9")  # the discard port: nothing listens
    assert httpx.get(f"{gateway.url}/readyz").status_code == 503
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


class RecordingEngine:
    """A fake engine behind ``httpx.MockTransport``: records each request, answers a canned stream."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served-model"}]})
        if request.url.path == "/tokenize":  # the gateway learns its token accounting once per engine
            return httpx.Response(200, json={"count": 400, "max_model_len": 4096, "tokens": []})
        if request.url.path != "/v1/chat/completions":  # /metrics scrapes, /health: nothing to record
            return httpx.Response(404, json={"error": {"message": "not here"}})
        self.requests.append((dict(request.headers), json.loads(request.content)))
        verdict = '{"verdict":"allow","categories":[],"confidence":0.9}'
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": verdict}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {
                "choices": [],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 12, "prompt_tokens_details": None},
            },
        ]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def test_the_engine_request_is_built_as_the_production_engine_expects() -> None:
    from gateway.http.app import create_app
    from gateway.settings import Settings

    engine = RecordingEngine()
    app = create_app(Settings(), engine_transport=httpx.MockTransport(engine))
    with ThreadedServer(app) as gateway:
        for seed, thinking in ((1, "on"), (2, "off")):
            moderate(
                gateway,
                model="m",
                input=image_input(make_keyframe("allow", 640, 360, seed=seed)),
                extra_headers={"X-Modgate-Thinking": thinking},
            )
    (headers_on, on), (headers_off, off) = engine.requests
    assert on["model"] == "served-model"
    system_on, user_on = on["messages"]
    assert system_on["role"] == "system"
    assert system_on == off["messages"][0]  # byte-identical across requests
    assert [part["type"] for part in user_on["content"]] == ["image_url", "text"]
    assert user_on["content"][0]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert user_on["content"][0]["uuid"] != off["messages"][1]["content"][0]["uuid"]
    assert on["chat_template_kwargs"] == {"enable_thinking": True}
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    assert on["structured_outputs"] == {"regex": compact_regex()}  # the policy's default: the compact verdict
    assert (on["logprobs"], on["top_logprobs"]) == (True, 10)  # the confidence is read from these
    assert on["max_completion_tokens"] > off["max_completion_tokens"]
    assert on["stream"] is True
    assert on["stream_options"] == {"include_usage": True}
    assert headers_on["x-request-id"] != headers_off["x-request-id"]
