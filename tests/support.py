"""Helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from gateway.embedded import ThreadedServer

ADMIN_TOKEN = "test-admin-token-0123456789"

SimFactory = Callable[..., ThreadedServer]
GatewayFactory = Callable[..., ThreadedServer]


def data_url(image: bytes, mime: str = "image/jpeg") -> str:
    """A ``data:`` URL for image bytes."""
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def image_input(*frames: bytes) -> list[dict[str, Any]]:
    """Moderation ``input`` parts for JPEG frames."""
    return [{"type": "image_url", "image_url": {"url": data_url(frame)}} for frame in frames]
