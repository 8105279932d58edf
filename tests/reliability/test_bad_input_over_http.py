"""Bad requests and a corpus of bad images, generated here, posted to a running gateway: each gets its 4xx in
the OpenAI error shape (or, for unusual but valid images, a verdict), and the gateway stays up throughout."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from collections.abc import Callable, Iterator

import httpx
import pytest
from PIL import Image

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from gateway.http.app import create_app
from gateway.http.routes.moderations import json_depth, openers_at_most
from gateway.settings import Settings
from tests.reliability.conftest import error_body
from tests.support import data_url, image_input

LIMITS = {
    "shaping": {"max_body_bytes": 4 << 20, "max_image_bytes": 1 << 20, "max_images_per_request": 4},
    "limits": {"max_image_pixels": 4_000_000, "max_json_depth": 32},
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[httpx.Client]:
    """One gateway (with small limits, over the instant simulator) for every case here."""
    from deploy.simulator import PRESETS, create_sim_app

    with (
        ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)) as sim,
        ThreadedServer(create_app(Settings(engine={"url": sim.url}, **LIMITS))) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        yield client
        # Whatever came before, the gateway still answers, and still moderates.
        assert client.get("/healthz").status_code == 200
        good = client.post("/v1/moderations", json={"input": image_input(make_keyframe("allow", 320, 180))})
        assert good.status_code == 200


# --- the image corpus ------------------------------------------------------------------------------------


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(side: int = 20_000) -> bytes:
    """A real decompression bomb: a 1-bit grey PNG of side² pixels, all zero, a few tens of KiB."""
    row = b"\x00" * (1 + side // 8)
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    chunks = png_chunk(b"IHDR", header) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def png_claiming(width: int, height: int) -> bytes:
    """A PNG header claiming huge dimensions, with a token IDAT."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real JPEG whose frame header (SOF0) is rewritten to claim other dimensions."""
    data = bytearray(make_keyframe("allow", 64, 64))
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def animated(fmt: str) -> bytes:
    frames = [Image.new("RGB", (64, 64), colour) for colour in ("red", "green", "blue")]
    return encoded(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)


def sixteen_bit_png() -> bytes:
    image = Image.new("I;16", (320, 180))
    image.putdata([(x * 200) % 65536 for x in range(320 * 180)])
    return encoded(image, "PNG")


KEYFRAME = make_keyframe("allow", 320, 180, seed=3)
ON_GRID = make_keyframe("allow", 1088, 608, seed=3)  # passes through: a lone one is checked on the event loop

# (case id, image bytes, expected status, expected error code or None for a verdict)
CORPUS: list[tuple[str, Callable[[], bytes], int, str | None]] = [
    ("truncated JPEG", lambda: KEYFRAME[: len(KEYFRAME) // 2], 400, "image_decode_failed"),
    ("JPEG with its end cut off a few bytes", lambda: KEYFRAME[:-40], 400, "image_decode_failed"),
    ("on-grid JPEG cut in half", lambda: ON_GRID[: len(ON_GRID) // 2], 400, "image_decode_failed"),
    ("on-grid JPEG with its end cut off a few bytes", lambda: ON_GRID[:-40], 400, "image_decode_failed"),
    ("wrong magic bytes", lambda: b"\x00\x00\x00\x00" + KEYFRAME[4:], 415, "unsupported_image_format"),
    ("random bytes", lambda: bytes(range(256)) * 8, 415, "unsupported_image_format"),
    ("decompression bomb PNG", png_bomb, 413, "image_dimensions_too_large"),
    ("PNG claiming 100000x100000", lambda: png_claiming(100_000, 100_000), 413, "image_dimensions_too_large"),
    ("JPEG claiming 65000x65000", lambda: jpeg_claiming(65_000, 65_000), 413, "image_dimensions_too_large"),
    (
        "over the pixel limit",
        lambda: encoded(Image.new("RGB", (3000, 2000)), "JPEG"),
        413,
        "image_dimensions_too_large",
    ),
    ("a PNG with zero width", lambda: png_claiming(0, 10), 400, "empty_image"),
    (
        "a 1000:1 strip",
        lambda: encoded(Image.new("RGB", (4000, 4)), "PNG"),
        422,
        "image_aspect_ratio_too_large",
    ),
    ("animated PNG", lambda: animated("PNG"), 422, "animated_image"),
    ("animated WebP", lambda: animated("WEBP"), 422, "animated_image"),
    (
        "SVG",
        lambda: b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><script/></svg>',
        415,
        "unsupported_image_format",
    ),
    ("GIF", lambda: encoded(Image.new("RGB", (64, 64)), "GIF"), 415, "unsupported_image_format"),
    ("BMP", lambda: encoded(Image.new("RGB", (64, 64)), "BMP"), 415, "unsupported_image_format"),
    ("TIFF", lambda: encoded(Image.new("RGB", (64, 64)), "TIFF"), 415, "unsupported_image_format"),
    (
        "HTML behind JPEG magic",
        lambda: b"\xff\xd8\xff<html><script>alert(1)</script></html>",
        400,
        "image_decode_failed",
    ),
    ("over the byte limit", lambda: b"\xff\xd8\xff" + bytes(1024 * 1024), 413, "image_too_large"),
    # Unusual but valid: shaped from their pixels and moderated.
    ("CMYK JPEG", lambda: encoded(Image.new("CMYK", (320, 180), (0, 50, 100, 0)), "JPEG"), 200, None),
    ("16-bit grey PNG", sixteen_bit_png, 200, None),
    ("polyglot: JPEG with a ZIP appended", lambda: KEYFRAME + b"PK\x03\x04" + bytes(200), 200, None),
    (
        "polyglot: PNG with HTML appended",
        lambda: encoded(Image.new("RGB", (320, 180)), "PNG") + b"<html><script>alert(1)</script>",
        200,
        None,
    ),
]


@pytest.mark.parametrize(("case", "make", "status", "code"), CORPUS, ids=[case for case, *_ in CORPUS])
def test_each_corpus_image_gets_its_status(
    gateway: httpx.Client, case: str, make: Callable[[], bytes], status: int, code: str | None
) -> None:
    response = gateway.post("/v1/moderations", json={"input": image_input(make())})
    assert response.status_code == status, f"{case}: {response.text[:300]}"
    if code is None:
        assert response.json()["results"][0]["modgate"]["action"] in ("allow", "review", "block")
    else:
        error = error_body(response)
        assert (error["code"], error["type"]) == (code, "invalid_request_error")


# --- bad requests --------------------------------------------------------------------------------------


def image_part(url: str) -> list[dict[str, object]]:
    return [{"type": "image_url", "image_url": {"url": url}}]


def post_json(gateway: httpx.Client, content: bytes) -> httpx.Response:
    return gateway.post("/v1/moderations", content=content, headers={"Content-Type": "application/json"})


def test_a_data_url_with_no_bytes_gets_400(gateway: httpx.Client) -> None:
    response = gateway.post("/v1/moderations", json={"input": image_part("data:image/jpeg;base64,")})
    assert (response.status_code, error_body(response)["code"]) == (400, "empty_image")


def test_invalid_base64_gets_400(gateway: httpx.Client) -> None:
    response = gateway.post("/v1/moderations", json={"input": image_part("data:image/jpeg;base64,@@@@ nope")})
    assert (response.status_code, error_body(response)["code"]) == (400, "invalid_data_url")


def test_a_data_url_that_is_not_base64_gets_400(gateway: httpx.Client) -> None:
    response = gateway.post("/v1/moderations", json={"input": image_part("data:image/jpeg,rawbytes")})
    assert (response.status_code, error_body(response)["code"]) == (400, "invalid_data_url")


def test_a_data_url_declaring_a_non_image_type_gets_415(gateway: httpx.Client) -> None:
    payload = base64.b64encode(KEYFRAME).decode()
    response = gateway.post("/v1/moderations", json={"input": image_part(f"data:text/html;base64,{payload}")})
    assert response.status_code == 415


def test_a_remote_url_is_refused_while_remote_images_are_off(gateway: httpx.Client) -> None:
    response = gateway.post(
        "/v1/moderations", json={"input": image_part("http://169.254.169.254/latest/meta-data")}
    )
    assert (response.status_code, error_body(response)["code"]) == (400, "invalid_data_url")


def test_more_images_than_allowed_gets_400(gateway: httpx.Client) -> None:
    response = gateway.post("/v1/moderations", json={"input": image_input(*[KEYFRAME] * 5)})
    assert response.status_code == 400
    assert error_body(response)["param"] == "input"


def test_an_empty_input_list_gets_400(gateway: httpx.Client) -> None:
    response = gateway.post("/v1/moderations", json={"input": []})
    assert response.status_code == 400


def test_a_body_over_the_size_limit_gets_413(gateway: httpx.Client) -> None:
    response = gateway.post("/v1/moderations", json={"input": image_part(data_url(bytes(5 * 1024 * 1024)))})
    assert response.status_code == 413
    error_body(response)


def test_json_nested_past_the_depth_limit_gets_400(gateway: httpx.Client) -> None:
    response = post_json(gateway, b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert (response.status_code, error_body(response)["code"]) == (400, "json_too_deep")


def test_brackets_inside_strings_do_not_count_as_depth(gateway: httpx.Client) -> None:
    response = post_json(gateway, b'{"input": "' + b"[" * 5000 + b'"}')
    assert response.status_code == 200


@pytest.mark.parametrize(
    "body", [b'{"a": [1, {"b": []}]}', b"[" * 32, b"[" * 33, b"{[" * 16 + b"{", b'"' + b"{" * 40 + b'"', b""]
)
def test_a_body_with_no_more_brackets_than_the_limit_is_passed_unread(body: bytes) -> None:
    # the short cut before json_depth: as many openers as the limit cannot nest deeper than it
    assert openers_at_most(body, 32) == (body.count(b"[") + body.count(b"{") <= 32)
    if openers_at_most(body, 32):
        assert json_depth(body, stop_after=32) <= 32


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"{",
        b'{"input": 5}',
        b'{"input": "x", "unknown": 1}',
        b"[]",
        b'"text"',
        b'{"input": [{"type": "video", "url": "x"}]}',
        b'{"input": "\\ud800"}',
        b"\xff\xfe\x00",
    ],
    ids=[
        "empty",
        "not json",
        "unclosed",
        "wrong type",
        "unknown field",
        "array",
        "string",
        "unknown part",
        "lone surrogate",
        "not utf-8",
    ],
)
def test_malformed_bodies_get_400(gateway: httpx.Client, body: bytes) -> None:
    response = post_json(gateway, body)
    assert response.status_code == 400, response.text
    assert error_body(response)["type"] == "invalid_request_error"
