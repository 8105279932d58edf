"""The gateway's OpenAPI document: valid (openapi-spec-validator), every status a business route really
answers documented there with the OpenAI error schema, every request body closed where extra fields are
refused and with the patterns the server enforces; a 405 names the allowed methods; /metrics names its
charset once."""

from __future__ import annotations

import contextlib
import io
import re
from concurrent.futures import ThreadPoolExecutor
from email.message import Message
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis.strategies import from_regex
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from PIL import Image

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import Faults
from gateway.http.openapi import REMOTE_URL_PATTERN
from gateway.moderation.remote_images import RemoteImageFetcher, RemoteImageRefused
from shaping.verdict import MODEL_CATEGORIES
from tests.support import GatewayFactory, SimFactory, data_url, image_input

BUSINESS_ROUTES = {
    ("post", "/v1/moderations"): {200, 400, 401, 403, 413, 415, 422, 429, 500, 502, 503, 504},
    ("post", "/v1/videos/{video_id}/keyframes"): {200, 400, 401, 403, 413, 415, 422, 429, 500, 502, 503, 504},
    ("post", "/v1/jobs"): {202, 400, 401, 403, 409, 413, 415, 422, 429, 500, 503},
    ("get", "/v1/jobs/{job_id}"): {200, 401, 404, 500, 503},
    ("put", "/admin/thinking-policy"): {200, 400, 401, 403, 409, 413, 422, 503},
    ("post", "/admin/thinking-policy/rollback"): {200, 400, 401, 403, 404, 409, 503},
}


def openapi(gateway: ThreadedServer) -> dict[str, Any]:
    """The document the gateway serves about itself."""
    document: dict[str, Any] = httpx.get(f"{gateway.url}/schema/openapi.json", timeout=30).json()
    return document


def documented_schema(spec: dict[str, Any], method: str, path: str, status: int) -> Draft202012Validator:
    """A validator for the body the document promises for ``status`` (its ``$ref``s resolved in place)."""
    response = spec["paths"][path][method]["responses"][str(status)]
    schema = response["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": spec["components"]})


def test_the_openapi_document_is_valid(gateway: ThreadedServer) -> None:
    spec = openapi(gateway)
    validate(spec)  # raises OpenAPIValidationError, naming the offending node, if it is not
    assert spec["openapi"].startswith("3.1")


def test_every_business_route_documents_each_status_with_the_openai_error_shape(
    gateway: ThreadedServer,
) -> None:
    spec = openapi(gateway)
    error = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": "c"}}
    for (method, path), statuses in BUSINESS_ROUTES.items():
        documented = {int(status) for status in spec["paths"][path][method]["responses"]}
        assert statuses <= documented, f"{method.upper()} {path} lacks {sorted(statuses - documented)}"
        for status in documented - {200, 202}:
            validator = documented_schema(spec, method, path, status)
            validator.validate(error)
            assert not validator.is_valid({"detail": "Bad Request", "status_code": 400}), (path, status)


def image_part(url: str) -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": url}}]


def gif() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 36), "white").save(buffer, "GIF")
    return buffer.getvalue()


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buffer, "PNG")
    return buffer.getvalue()


def test_each_status_moderations_answers_is_documented_with_the_body_it_sends(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    frame = image_input(make_keyframe("allow", 320, 180, seed=5))
    sim = start_sim()
    slow = start_sim(faults=Faults(slow_rate=1.0, slow_s=3.0))
    failing = start_sim(faults=Faults(error_rate=1.0))
    keys = {"auth": {"api_keys": "key-1:tenant-a"}}
    auth = {"Authorization": "Bearer key-1"}
    gateway = start_gateway(engine={"url": sim.url}, shaping={"max_body_bytes": 256 * 1024}, **keys)
    one_slot = start_gateway(  # nothing reused: every call needs the one engine slot
        engine={"url": slow.url, "max_inflight": 1}, admission={"queue_size": 0},
        shaping={"verdict_cache_ttl_s": 0},
        **keys,
    )
    impatient = start_gateway(engine={"first_token_timeout_s": 0.5, "url": slow.url}, **keys)
    no_engine = start_gateway(engine={"connect_retries": 0, "url": "http://127.0.0.1:9"}, **keys)
    broken_engine = start_gateway(engine={"connect_retries": 0, "url": failing.url}, **keys)

    def post(server: ThreadedServer, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        sent = auth if headers is None else headers
        return httpx.post(f"{server.url}/v1/moderations", json=body, headers=sent, timeout=60)

    answers: dict[int, httpx.Response] = {
        200: post(gateway, {"input": frame}),
        400: post(gateway, {"input": 5}),
        401: post(gateway, {"input": frame}, headers={"Authorization": "Bearer wrong"}),
        413: post(gateway, {"input": image_input(bytes(300 * 1024))}),
        415: post(gateway, {"input": image_part(data_url(gif(), "image/gif"))}),
        422: post(gateway, {"input": image_part(data_url(png(2010, 8), "image/png"))}),  # past 200:1
        502: post(broken_engine, {"input": frame}),
        503: post(no_engine, {"input": frame}),
        504: post(impatient, {"input": frame}),
    }
    # 429: three calls at once for one engine slot and no waiting room: at least one is refused.
    for _ in range(5):
        with ThreadPoolExecutor(max_workers=3) as pool:
            rush = list(pool.map(lambda _: post(one_slot, {"input": frame}), range(3)))
        refused = [response for response in rush if response.status_code == 429]
        if refused:
            answers[429] = refused[0]
            break
    assert 429 in answers, [response.status_code for response in rush]
    spec = openapi(gateway)
    for status, response in answers.items():
        assert response.status_code == status, (status, response.text)
        documented_schema(spec, "post", "/v1/moderations", status).validate(response.json())
    assert answers[429].headers["retry-after"].isdigit()


def test_metrics_names_its_charset_once(gateway: ThreadedServer) -> None:
    header = httpx.get(f"{gateway.url}/metrics", timeout=30).headers["content-type"]
    assert header.lower().count("charset") == 1, header
    message = Message()
    message["content-type"] = header
    assert message.get_content_type() == "text/plain"
    assert message.get_param("version") == "0.0.4"
    assert message.get_content_charset() == "utf-8"
    names = [name.lower() for name, _ in message.get_params() or []]
    assert len(names) == len(set(names)), header


REQUEST_BODIES = {
    ("post", "/v1/moderations"): "ModerationRequest",
    ("post", "/v1/videos/{video_id}/keyframes"): "KeyframeBatchRequest",
    ("post", "/v1/jobs"): "JobRequest",
    ("put", "/admin/thinking-policy"): "ThinkingPolicyChange",
    ("post", "/admin/thinking-policy/rollback"): "RollbackRequest",
}


def test_every_request_body_is_documented_as_a_closed_object(gateway: ThreadedServer) -> None:
    spec = openapi(gateway)
    schemas = spec["components"]["schemas"]
    for (method, path), name in REQUEST_BODIES.items():
        body = spec["paths"][path][method]["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert schemas[name]["additionalProperties"] is False, name  # the server answers 400 to extras
    for nested in ("RequestOptions", "Keyframe", "ThinkingRule", "LoadRule", "EscalationPolicy"):
        assert schemas[nested]["additionalProperties"] is False, nested
    assert "ImageURL" in schemas
    assert schemas["ImageURL"].get("additionalProperties") is not False  # OpenAI's "detail" is ignored
    assert schemas["ThinkingPolicyChange"]["required"] == ["reason"]
    tags = schemas["RequestOptions"]["properties"]["tags"]
    assert (tags["maxItems"], tags["items"]["maxLength"]) == (16, 64)


def test_the_image_url_pattern_is_what_the_server_takes(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    sim = start_sim()
    data_only = openapi(start_gateway(engine={"url": sim.url}))["components"]["schemas"]["ImageURL"]
    remote_images = {"enabled": True, "allowlist": ["cdn.example.com"]}
    remote = openapi(start_gateway(engine={"url": sim.url}, remote_images=remote_images))
    pattern = re.compile(data_only["properties"]["url"]["pattern"])
    remote_pattern = re.compile(remote["components"]["schemas"]["ImageURL"]["properties"]["url"]["pattern"])
    keyframe = data_url(make_keyframe("allow", 320, 180, seed=1))
    assert pattern.search(keyframe)
    for refused in ("https://cdn.example.com/k.jpg", "data:text/plain;base64,AAAA", "data:image/jpeg,raw",
                    "data:image/jpeg;base64,AAA", "data:image/jpeg;base64,", "0"):
        assert not pattern.search(refused), refused
    assert remote_pattern.search(keyframe)
    assert remote_pattern.search("https://cdn.example.com/k.jpg")
    assert not remote_pattern.search("ftp://cdn.example.com/k.jpg")


def test_with_remote_images_on_a_url_the_document_allows_off_the_allowlist_is_a_documented_403(
    start_sim: SimFactory, start_gateway: GatewayFactory
) -> None:
    remote_images = {"enabled": True, "allowlist": ["cdn.example.com"]}
    gateway = start_gateway(engine={"url": start_sim().url}, remote_images=remote_images)
    spec = openapi(gateway)
    pattern = re.compile(spec["components"]["schemas"]["ImageURL"]["properties"]["url"]["pattern"])
    video = re.compile(spec["components"]["schemas"]["VideoSource"]["properties"]["url"]["pattern"])
    assert pattern.search("https://cdn.example.org/a.jpg")
    assert video.search("https://cdn.example.org/a.mp4")
    for malformed in ("https://a b", "https://999.1.1.1/a.jpg", "https://cdn.example.com:99999/", "https://"):
        assert not pattern.search(malformed), malformed  # no URL: the document excludes it (the server: 4xx)
        assert not video.search(malformed), malformed
    answers = {
        "/v1/moderations": httpx.post(f"{gateway.url}/v1/moderations", timeout=60, json={
            "input": image_part("https://cdn.example.org/a.jpg")}),
        "/v1/jobs": httpx.post(f"{gateway.url}/v1/jobs", timeout=60, json={
            "video_id": "v", "video": {"url": "https://cdn.example.org/a.mp4"}}),
    }
    codes = {"/v1/moderations": "remote_image_refused", "/v1/jobs": "video_url_refused"}  # a video's own word
    for path, answer in answers.items():
        assert answer.status_code == 403, (path, answer.text)
        assert answer.json()["error"]["code"] == codes[path]
        documented_schema(spec, "post", path, 403).validate(answer.json())


@given(url=from_regex(REMOTE_URL_PATTERN, fullmatch=True))
@settings(max_examples=300, deadline=None)
def test_every_remote_url_the_document_allows_parses_as_the_fetcher_reads_it(url: str) -> None:
    fetcher = RemoteImageFetcher(["cdn.example.com"], max_bytes=1, timeout_s=1, max_redirects=0)
    with contextlib.suppress(RemoteImageRefused):  # a host off the allowlist: a 403 the document lists
        fetcher.check_url(url)  # never RemoteImageMalformed, the 400 of a URL that is no URL


def test_what_the_document_refuses_the_server_refuses_with_a_400(gateway: ThreadedServer) -> None:
    frame = image_input(make_keyframe("allow", 320, 180, seed=2))
    refused = {
        "an extra field": {"input": frame, "stray": 1},
        "false for an integer": {"input": frame, "modgate": {"priority": False}},
        "a string for an integer": {"input": frame, "modgate": {"priority": "1"}},
        "a tag past 64 characters": {"input": frame, "modgate": {"tags": ["t" * 65]}},
        "an http URL": {"input": [{"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}]},
    }
    for what, body in refused.items():
        answer = httpx.post(f"{gateway.url}/v1/moderations", json=body, timeout=60)
        assert answer.status_code == 400, (what, answer.text)
    # and what it accepts, the server takes: 2.0 is an integer to JSON Schema
    integral = {"input": frame, "modgate": {"priority": 2.0}}
    assert httpx.post(f"{gateway.url}/v1/moderations", json=integral, timeout=60).status_code == 200


def test_a_405_names_the_methods_the_route_allows(gateway: ThreadedServer) -> None:
    spec = openapi(gateway)
    for path, operations in spec["paths"].items():
        documented = {method.upper() for method in operations}
        concrete = path.replace("{video_id}", "v1").replace("{job_id}", "job_0")
        for method in ("TRACE", "DELETE", "PATCH"):
            if method in documented:
                continue
            answer = httpx.request(method, f"{gateway.url}{concrete}", timeout=30)
            assert answer.status_code == 405, (method, path, answer.status_code)
            allowed = {name.strip() for name in answer.headers["allow"].split(",")}
            assert allowed == documented | {"OPTIONS"}, (method, path, allowed)


def test_the_document_says_which_bearer_each_route_takes_and_which_categories_escalation_knows(
    start_gateway: GatewayFactory, start_sim: SimFactory
) -> None:
    sim = start_sim("instant")
    keyed = openapi(start_gateway(engine={"url": sim.url}, auth={"api_keys": "key-a-0123456789:tenant-a"}))
    open_ = openapi(start_gateway(engine={"url": sim.url}))
    validate(keyed)
    schemes = keyed["components"]["securitySchemes"]
    assert {name: (s["type"], s["scheme"]) for name, s in schemes.items()} == {
        "apiKey": ("http", "bearer"), "adminToken": ("http", "bearer")
    }
    assert keyed["paths"]["/admin/thinking-policy"]["put"]["security"] == [{"adminToken": []}]
    assert keyed["paths"]["/admin/moderation-policy"]["get"]["security"] == [{"adminToken": []}]
    assert keyed["paths"]["/v1/moderations"]["post"]["security"] == [{"apiKey": []}]
    assert open_["paths"]["/v1/moderations"]["post"]["security"] == [{"apiKey": []}, {}]  # no key: optional
    always = keyed["components"]["schemas"]["EscalationPolicy"]["properties"]["always_categories"]
    assert always["items"] == {"enum": list(MODEL_CATEGORIES)}


def test_a_video_job_may_be_posted_as_multipart_as_the_document_says(gateway: ThreadedServer) -> None:
    body = openapi(gateway)["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    form = body["multipart/form-data"]
    assert form["schema"]["required"] == ["video", "job"]
    assert form["schema"]["additionalProperties"] is False  # the route refuses any other part
    assert form["schema"]["properties"]["video"]["format"] == "binary"
    job = form["schema"]["properties"]["job"]
    assert job["additionalProperties"] is False
    assert "video_id" in job["required"]
    assert not {"frames", "video"} & set(job["properties"])  # the route refuses either in the job part
    assert form["encoding"]["job"]["contentType"] == "application/json"
