"""Smoke test: the real vLLM CPU engine boots and serves the tiny VLM with the production request shape."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from PIL import Image, ImageDraw

pytestmark = pytest.mark.vllm


def keyframe_data_url() -> str:
    """A small generated JPEG keyframe as a data URL."""
    image = Image.new("RGB", (320, 180), (40, 90, 160))
    ImageDraw.Draw(image).rectangle((100, 40, 220, 140), fill=(230, 200, 30))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def test_health_answers_200(real_engine_url: str) -> None:
    response = httpx.get(f"{real_engine_url}/health", timeout=10)
    assert response.status_code == 200


def test_models_lists_tiny(real_engine_url: str) -> None:
    response = httpx.get(f"{real_engine_url}/v1/models", timeout=10)
    assert response.status_code == 200
    assert "tiny" in [model["id"] for model in response.json()["data"]]


def test_chat_with_an_image_counts_image_tokens(real_engine_url: str) -> None:
    request = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "你是一名视频内容安全审核员。只输出一个 JSON 对象。"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": keyframe_data_url()}},
                    {"type": "text", "text": "请审核这张视频关键帧截图。"},
                ],
            },
        ],
        "max_completion_tokens": 8,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    response = httpx.post(f"{real_engine_url}/v1/chat/completions", json=request, timeout=60)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"]["multimodal_tokens"]["image"] > 0
