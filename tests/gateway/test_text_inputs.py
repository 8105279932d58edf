"""Text inputs through the official ``openai`` client: judged for real, one result per string of a list."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.http.app import create_app
from gateway.settings import Settings
from shaping.prompt import PROMPT_VERSIONS, RequestOptions, build_chat_request, load_system_prompt
from shaping.verdict import compact_regex, response_format
from tests.support import SimFactory, forward, image_input


def moderate(gateway: ThreadedServer, **kwargs: Any) -> Any:
    """``client.moderations.create(**kwargs)`` with the official client, closed afterwards."""
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
        return client.moderations.create(**kwargs)


def test_a_calm_text_is_judged_and_allowed_not_flagged_for_review(gateway: ThreadedServer) -> None:
    (result,) = moderate(gateway, input="a calm street at noon").results
    details = result.model_extra["modgate"]
    assert (result.flagged, details["action"], details["reason"]) == (False, "allow", None)
    assert result.category_applied_input_types.violence == ["text"]
    assert details["frame_sha256"] is None
    assert details["completion_tokens"] > 0  # the engine judged it


def test_a_violent_text_is_blocked_with_its_category(gateway: ThreadedServer) -> None:
    (result,) = moderate(gateway, input="I will stab him with a knife tonight").results
    assert result.flagged
    assert result.categories.violence
    assert result.category_scores.violence > 0.5
    assert result.model_extra["modgate"]["reason"] is None


def test_a_list_of_strings_gets_one_result_per_string_in_order(gateway: ThreadedServer) -> None:
    response = moderate(gateway, input=["a calm street at noon", "buy cocaine here", "a quiet park"])
    assert [r.model_extra["modgate"]["action"] for r in response.results] == ["allow", "block", "allow"]
    assert response.results[1].categories.illicit
    assert all(r.category_applied_input_types.illicit == ["text"] for r in response.results)


def test_a_list_with_an_image_and_text_keeps_one_result_per_image(gateway: ThreadedServer) -> None:
    caption = {"type": "text", "text": "a caption"}
    response = moderate(gateway, input=[*image_input(make_keyframe("allow", 320, 180, seed=2)), caption])
    (result,) = response.results
    assert result.category_applied_input_types.violence == ["text", "image"]  # the caption was judged too
    assert result.category_applied_input_types.hate == ["text"]


def test_the_text_goes_to_the_engine_as_the_user_turn_under_the_canonical_system_prompt(
    start_sim: SimFactory,
) -> None:
    engine = start_sim()
    sent: list[dict[str, Any]] = []

    async def record(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            sent.append(httpx.Response(200, content=request.content).json())
        return await forward(request, engine.url)

    # a gateway whose engine calls are recorded on their way through to the simulator
    with ThreadedServer(create_app(Settings(), engine_transport=httpx.MockTransport(record))) as gateway:
        moderate(gateway, input="a calm street at noon")
    (body,) = sent
    system, user = body["messages"]
    # the policy's default verdict format is compact: its canonical prompt, its one-verdict grammar
    assert system == {"role": "system", "content": load_system_prompt(PROMPT_VERSIONS["compact"]).text}
    assert user["role"] == "user"
    assert [part["type"] for part in user["content"]] == ["text"]
    assert "a calm street at noon" in user["content"][0]["text"]
    assert body["structured_outputs"] == {"regex": compact_regex(1)}  # one verdict, never "frames": []
    assert "response_format" not in body


def test_a_request_without_images_asks_for_one_verdict() -> None:
    options = RequestOptions(model="m", enable_thinking=False, max_completion_tokens=64)
    body = build_chat_request(load_system_prompt(), [], "some text", options)
    assert body["response_format"] == response_format(1)
    regex = build_chat_request(
        load_system_prompt(), [], "some text",
        RequestOptions(model="m", enable_thinking=False, max_completion_tokens=64, constraint="regex"),
    )
    assert "structured_outputs" in regex
