"""The OpenAPI document says exactly what the server accepts.

Litestar draws request bodies from the models' fields, but drops what pydantic enforces beyond them: closed
objects (``extra="forbid"``: an unknown field is a 400), constraints on list items, and it cannot know
the checks a route makes with its settings (data: URLs only unless remote images are on, frames per batch,
webhooks off without a secret) or the body ``PUT /admin/thinking-policy`` reads itself. So each request
body's schema is pydantic's own validation schema, completed here with what this app's settings enforce,
in the one document Litestar serves (JSON, YAML and the browsable page alike).

What a schema cannot state (a low mark below its high mark, a review mark above its block mark, unique rule
names, an image's bytes) is refused with a 422 or an image's own 413/415/422, never with the 400 that means
"not what the document says"; the schemas' descriptions say so, and tests/reliability/schemathesis.toml allows
exactly those, operation by operation.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar

# Litestar's own plugin holds the one served document (every rendering reads its dict); it is not exported
from litestar._openapi.plugin import OpenAPIPlugin
from pydantic import BaseModel

from gateway.decision_wire import DecisionRequest
from gateway.http.routes.admin import REASON_PATTERN, RollbackRequest
from gateway.http.routes.review import ReviewLabelRequest
from gateway.jobs.models import JobRequest
from gateway.jobs.service import IDEMPOTENCY_KEY_PATTERN
from gateway.moderation.keyframe_batch import VIDEO_ID_PATTERN, KeyframeBatchRequest
from gateway.policy.moderation import ModerationPolicy
from gateway.policy.rules import ThinkingPolicy
from gateway.settings import Settings
from gateway.wire import ModerationRequest
from shaping.image.data_url import DATA_URL_PATTERN
from shaping.verdict import MODEL_CATEGORIES

# An http(s) URL the fetcher parses (gateway/moderation/remote_images.py): a host name of ASCII labels whose
# last starts with a letter (no IP literal: httpx refuses a malformed one, "999.1.1.1", as no URL), an
# optional port, then printable ASCII only (httpx refuses a control character; a space is no URL either).
# A host off the allowlist is a 403 the document lists, not a 400.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_PORT = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?"
REMOTE_URL_PATTERN = (rf"^[Hh][Tt][Tt][Pp][Ss]?://(?:{_LABEL}\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
                      rf"{_PORT}(?:[/?#][!-~]*)?$")
REF = "#/components/schemas/{model}"
# What a PUT may carry besides the policy's own fields: ignored (the gateway fills them in)
SHOWN_ONLY = ("updated_at", "updated_by", "content_hash", "store", "changed")


def model_schema(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's validation schema of ``model``, its nested models put among the document's components."""
    schema = model.model_json_schema(ref_template=REF, mode="validation")
    schemas.update(schema.pop("$defs", {}))
    return schema


def policy_change(
    schemas: dict[str, Any], model: type[BaseModel] = ThinkingPolicy, title: str = "ThinkingPolicyChange"
) -> dict[str, Any]:
    """The body of ``PUT /admin/thinking-policy`` (or ``/admin/moderation-policy``): the policy's fields, a
    ``reason``, and optionally the ``version`` the change was made from."""
    schema = model_schema(model, schemas)
    properties = {
        name: value for name, value in schema["properties"].items()
        if name not in ("version", "reason", "updated_at", "updated_by")
    }
    properties["reason"] = {"type": "string", "pattern": REASON_PATTERN,
                            "description": "why (at least 3 characters besides surrounding spaces)"}
    properties["version"] = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                             "description": "the version the change was made from: 409 if it is stale"}
    for name in SHOWN_ONLY:
        properties[name] = {"description": "shown by GET; ignored"}
    return {**schema, "title": title, "properties": properties, "required": ["reason"]}


def bearer_security(document: dict[str, Any], *, keys_required: bool) -> None:
    """Say who may call what: ``/admin`` takes the admin token (or a reviewer's session), ``/v1`` a business
    service's API key (optional while no key is set), both as ``Authorization: Bearer``."""
    document.setdefault("components", {})["securitySchemes"] = {
        "apiKey": {"type": "http", "scheme": "bearer", "description": "a business service's API key"},
        "adminToken": {"type": "http", "scheme": "bearer",
                       "description": "MODGATE_AUTH__ADMIN_TOKEN (automation) or a signed-in operator or "
                                      "reviewer"},
    }
    business: list[dict[str, list[str]]] = [{"apiKey": []}] if keys_required else [{"apiKey": []}, {}]
    for path, operations in document["paths"].items():
        requirement = [{"adminToken": []}] if path.startswith("/admin") else (
            business if path.startswith("/v1") else None)
        if requirement is None:
            continue
        for method, operation in operations.items():
            if method in ("get", "put", "post", "delete", "patch"):
                operation["security"] = requirement


def image_url_pattern(settings: Settings) -> str:
    """What ``image_url.url`` may be: a base64 data: URL of an image (or http(s) with remote images on)."""
    if not settings.remote_images.enabled:
        return DATA_URL_PATTERN
    return f"(?:{DATA_URL_PATTERN})|(?:{REMOTE_URL_PATTERN})"


def video_url_pattern(settings: Settings) -> str:
    """A video's URL: a strict base64 ``data:video/…`` URL, or an http(s) URL where remote fetching is on."""
    data = DATA_URL_PATTERN.replace("^data:image/", "^data:video/", 1)
    return data if not settings.remote_images.enabled else f"(?:{data})|(?:{REMOTE_URL_PATTERN})"


def multipart_job(body: dict[str, Any], schemas: dict[str, Any], settings: Settings) -> None:
    """``POST /v1/jobs`` also takes a video as ``multipart/form-data`` (gateway/http/routes/jobs.py): the file
    as its ``video`` part, every other field of the job as the JSON object of its ``job`` part."""
    job = schemas["JobRequest"]
    fields = {name: value for name, value in job["properties"].items()
              if name not in ("frames", "video", "webhook_url")}
    fields["webhook_url"] = job["properties"]["webhook_url"]
    body["content"]["multipart/form-data"] = {
        "schema": {
            "type": "object",
            "required": ["video", "job"],
            "additionalProperties": False,  # any other part is refused (400), never dropped
            "properties": {
                "video": {
                    "type": "string", "format": "binary", "minLength": 1,
                    "description": f"the video file, at most MODGATE_VIDEOS__MAX_BYTES "
                                   f"({settings.videos.max_bytes:,} bytes); one that does not decode as a "
                                   "video is 413, 415 or 422, as a video data: URL's bytes",
                },
                "job": {
                    "type": "object", "additionalProperties": False, "properties": fields,
                    "required": [name for name in job.get("required", []) if name in fields],
                    "description": "the job's other fields (no frames, no video), as JSON",
                },
            },
        },
        "encoding": {"job": {"contentType": "application/json"}, "video": {"contentType": "video/*"}},
    }


def exact_openapi(app: Litestar, settings: Settings) -> None:
    """Complete the document ``app`` serves with what its routes and settings really accept."""
    document: dict[str, Any] = app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
    schemas: dict[str, Any] = document["components"]["schemas"]
    for model in (ModerationRequest, KeyframeBatchRequest, JobRequest, RollbackRequest, ReviewLabelRequest,
                  DecisionRequest):
        schemas[model.__name__] = model_schema(model, schemas)
    schemas["ThinkingPolicyChange"] = policy_change(schemas)
    schemas["ModerationPolicyChange"] = policy_change(schemas, ModerationPolicy, "ModerationPolicyChange")
    entry = schemas["ModerationEntry"]["properties"]  # the categories a policy may name: the model's own
    for form in entry["categories"].get("anyOf", [entry["categories"]]):
        if form.get("type") == "array":
            form["items"] = {"enum": list(MODEL_CATEGORIES)}
    for form in entry["thresholds"].get("anyOf", [entry["thresholds"]]):
        if form.get("type") == "object":
            form["propertyNames"] = {"enum": list(MODEL_CATEGORIES)}
    image_url = schemas["ImageURL"]["properties"]["url"]
    image_url["pattern"] = image_url_pattern(settings)
    image_url["description"] = ("its bytes must be a still JPEG, PNG or WebP (else 415) that decodes within "
                                "the size and pixel limits (else 413 or 422)")
    decision_image = schemas["InputImage"]["properties"]["image_url"]
    decision_image["pattern"] = image_url_pattern(settings)
    decision_image["description"] = image_url["description"]
    schemas["ChoiceQuestion"]["properties"]["choices"]["description"] = (
        "2 to 255 options, each value given once (a value given twice is a 400, as OpenAI answers it: JSON "
        "Schema cannot state unique values inside objects); a string and a boolean of the same text differ"
    )
    batch = schemas["KeyframeBatchRequest"]["properties"]
    batch["frames"]["maxItems"] = settings.shaping.max_frames_per_batch
    job = schemas["JobRequest"]["properties"]
    job["frames"]["anyOf"][0]["maxItems"] = settings.jobs.max_frames
    # Exactly one of frames and a video (a null is as good as absent); sampling only with a video.
    schemas["JobRequest"]["oneOf"] = [
        {"properties": {"frames": {"type": "array"}, "video": {"type": "null"}, "sampling": {"type": "null"}},
         "required": ["frames"]},
        {"properties": {"video": {"type": "object"}, "frames": {"type": "null"}}, "required": ["video"]},
    ]
    schemas["VideoSource"]["properties"]["url"]["pattern"] = video_url_pattern(settings)
    job["video_id"]["pattern"] = VIDEO_ID_PATTERN
    if settings.jobs.webhook_secret is None:  # webhooks are off: only no webhook is accepted
        job["webhook_url"] = {"type": "null", "default": None,
                              "description": "webhooks are off (MODGATE_JOBS__WEBHOOK_SECRET unset)"}
    moderation_input = schemas["ModerationRequest"]["properties"]["input"]
    for form in moderation_input["anyOf"]:  # a list of inputs: at least one, at most the setting
        if form.get("type") == "array":
            form.update(minItems=1, maxItems=settings.shaping.max_images_per_request)
    paths = document["paths"]
    for path, change in (("/admin/thinking-policy", "ThinkingPolicyChange"),
                         ("/admin/moderation-policy", "ModerationPolicyChange")):
        paths[path]["put"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=change)}}},
        }
    threshold = schemas["CategoryThreshold"]["properties"]["review_from"]  # a rule between fields: 422
    threshold["description"] = "at most `block` (a policy whose review mark is above its block mark is 422)"
    # a block names at least one category; allow and review name none (the route's rule, stated here)
    schemas["ReviewLabelRequest"]["anyOf"] = [
        {"properties": {"action": {"const": "block"}, "categories": {"minItems": 1}},
         "required": ["action", "categories"]},
        {"properties": {"action": {"enum": ["allow", "review"]}, "categories": {"maxItems": 0}}},
    ]
    escalation = schemas["EscalationPolicy"]["properties"]["always_categories"]
    escalation["items"] = {"enum": list(MODEL_CATEGORIES)}  # the server refuses any other name (422)
    bearer_security(document, keys_required=bool(settings.auth.api_keys or settings.auth.api_keys_from_redis))
    for parameter in paths["/v1/videos/{video_id}/keyframes"]["post"].get("parameters", []):
        if parameter["name"] == "video_id" and parameter["in"] == "path":
            parameter["schema"] = {"type": "string", "pattern": VIDEO_ID_PATTERN}
    multipart_job(paths["/v1/jobs"]["post"]["requestBody"], schemas, settings)
    # A video job's result is a keyframe batch's document with its segments: valid as both, so "any of"
    result = schemas["Job"]["properties"]["result"]
    if "oneOf" in result:
        result["anyOf"] = result.pop("oneOf")
    for parameter in paths["/v1/jobs"]["post"].get("parameters", []):
        if parameter["name"] == "Idempotency-Key":
            parameter["schema"] = {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN}
