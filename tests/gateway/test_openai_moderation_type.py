"""Results are typed as OpenAI types them: the official client's own ``Moderation`` model takes every result
the gateway answers, image, captioned image and text, with the input types each category applies to."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai.types import Moderation
from pydantic import ValidationError

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from tests.support import image_input

CAPTION = {"type": "text", "text": "a caption from the uploader"}
TEXT_ONLY = ["harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
             "sexual/minors"]  # OpenAI judges these on text alone


def results(gateway: ThreadedServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = httpx.post(f"{gateway.url}/v1/moderations", json={"model": "m", **body}, timeout=60)
    assert response.status_code == 200, response.text
    answered: list[dict[str, Any]] = response.json()["results"]
    return answered


def validation_errors(result: dict[str, Any]) -> list[Any]:
    try:
        Moderation.model_validate(result)
    except ValidationError as exc:
        return list(exc.errors())
    return []


@pytest.mark.parametrize("label", ["allow", "review", "block:violence", "block:hate"])
def test_an_image_result_validates_as_openais_moderation_and_text_only_categories_apply_to_nothing(
    gateway: ThreadedServer, label: str
) -> None:
    (result,) = results(gateway, {"input": image_input(make_keyframe(label, 320, 180, seed=4))})
    assert validation_errors(result) == []
    applied = result["category_applied_input_types"]
    assert all(applied[category] == [] for category in TEXT_ONLY)
    assert applied["violence"] == applied["sexual"] == applied["self-harm"] == ["image"]


def test_a_captioned_image_applies_every_category_to_its_text_and_the_image_ones_to_both(
    gateway: ThreadedServer,
) -> None:
    frames = image_input(make_keyframe("block:violence", 320, 180, seed=5), make_keyframe("allow", 320, 180))
    answered = results(gateway, {"input": [*frames, CAPTION]})
    assert [validation_errors(result) for result in answered] == [[], []]
    for result in answered:
        applied = result["category_applied_input_types"]
        assert all(applied[category] == ["text"] for category in TEXT_ONLY)
        assert applied["violence"] == applied["violence/graphic"] == ["text", "image"]


def test_a_text_result_validates_as_openais_moderation(gateway: ThreadedServer) -> None:
    for result in results(gateway, {"input": ["a calm street at noon", "I will stab him tonight"]}):
        assert validation_errors(result) == []
        assert set(map(tuple, result["category_applied_input_types"].values())) == {("text",)}
