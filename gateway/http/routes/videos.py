"""``POST /v1/videos/{video_id}/keyframes``: one video's keyframes, a verdict per frame and one for the video.

The batch itself (packing, reuse, the video's verdict) is gateway/moderation/keyframe_batch.py, shared with
``POST /v1/jobs``, which takes the same body and answers the same document later. Behind the business-key
guard (gateway/http/guards.py).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from gateway.caller import Caller
from gateway.errors import InvalidRequest
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.routes import responses
from gateway.http.routes.moderations import refuse_deep_json, requested_mode
from gateway.http.routes.responses import error_responses
from gateway.moderation.keyframe_batch import (
    KeyframeBatchRequest,
    KeyframeBatchResponse,
    check_video_id,
    moderate_keyframes,
)
from gateway.moderation.service import ModerationService
from gateway.settings import Settings


@post(
    "/v1/videos/{video_id:str}/keyframes", status_code=200, before_request=refuse_deep_json,
    responses=error_responses(responses.MODERATION),
)
async def moderate_video_keyframes(
    request: Request[Any, Any, Any],
    video_id: FromPath[str],
    data: JSONBody[KeyframeBatchRequest],
    settings: NamedDependency[Settings],
    moderation: NamedDependency[ModerationService],
    caller: NamedDependency[Caller],
) -> KeyframeBatchResponse:
    """Moderate one video's keyframes: a verdict per frame and one for the video."""
    check_video_id(video_id)
    requested = requested_mode(request.headers.get("x-modgate-thinking"))
    limit = settings.shaping.max_frames_per_batch
    if len(data.frames) > limit:
        raise InvalidRequest(f"at most {limit} frames per batch, got {len(data.frames)}", param="frames")
    return await cancel_on_disconnect(
        request, moderate_keyframes(moderation, video_id, data, caller, requested)
    )


ROUTES = [moderate_video_keyframes]
