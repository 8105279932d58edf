"""The request path's groups: shaping keyframes, a request's bounds, remote images, tenants, the policy."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from shaping.tokens import TokenGrid, smallest_honoured_budget


def _comma_separated(value: object) -> object:
    """``"a.example,b.example"`` from the environment, or a list as given."""
    if isinstance(value, str):
        return [item.strip().lower() for item in value.split(",") if item.strip()]
    return value


HostList = Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)]
"""Host names, comma-separated in the environment (``cdn.example.com,.img.example.org``)."""


def _whole_number(value: object) -> object:
    """``"32"`` from the environment as 32: a ``Literal`` of numbers takes no string."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


class ShapingSettings(BaseModel):
    """How keyframes are shaped before they reach the engine."""

    pixels_per_token: Annotated[Literal[28, 32], BeforeValidator(_whole_number)] = 32
    # At least smallest_honoured_budget (128 at 32 pixels a token): see _budget_the_engine_honours.
    image_token_budget: int = Field(default=660, ge=1)
    jpeg_quality: int = Field(default=90, ge=50, le=100)
    max_image_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_images_per_request: int = Field(default=16, ge=1)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    animated: Literal["refuse", "first_frame"] = "refuse"
    user_text: str = "请审核这张视频关键帧截图。"
    # A text-only input (no image) is judged under the same system prompt, the caller's text in this turn.
    text_user_text: str = "请审核以下文本（没有图片，只依据文字判断）：\n{text}"
    # --- request shaping that cuts the engine's work per keyframe (issue 4) ---
    # Keyframes of one request (one tenant) packed into one engine request, one verdict each. K > 1 shares
    # the system prompt among K frames but changes the model's task: measure agreement before raising it.
    packing_k: int = Field(default=1, ge=1, le=16)
    packed_user_text: str = "请按顺序审核以下{frames}张视频关键帧截图，每张给出一个判定。"
    max_frames_per_batch: int = Field(default=64, ge=1, le=1024)  # POST /v1/videos/{video_id}/keyframes
    # Verdict reuse: exact (same shaped bytes) and near duplicates (pHash within this many bits AND a
    # 16×9 colour thumbnail within near_duplicate_colour_delta levels). -1: exact reuse only.
    near_duplicate_distance: int = Field(default=4, ge=-1, le=16)
    near_duplicate_colour_delta: int = Field(default=32, ge=0, le=255)
    verdict_cache_ttl_s: float = Field(default=3600.0, ge=0)  # 0: no verdict is reused
    verdict_cache_max_entries: int = Field(default=100_000, ge=1)  # in memory (no Redis): LRU beyond this
    # Pad the system prompt with policy guidance (shaping/prompts/guidance.v2.txt for the compact verdict,
    # guidance.v1.txt for JSON) so that the shared prefix ends on a whole prefix-cache block of the engine,
    # which the engine can then reuse in every request.
    block_filling_prefix: bool = False
    prefix_block_size: int | None = Field(default=None, ge=1)  # unset: the engine's vllm:cache_config_info
    # How each engine is made to hit the shared prefix (docs/prefix-strategy.md): auto picks per engine, at
    # start and after a restart: priming on vLLM with --prefix-match-unit, block filling where the block
    # fits prefix_fill_max_tokens, nothing on llama.cpp. block_filling_prefix=true is the old block-fill.
    prefix_strategy: Literal["auto", "match-unit", "block-fill", "off"] = "auto"
    # The longest shared prefix auto's block filling may make: 2,048 keeps a hybrid block (2,176 tiny, 2,960
    # on the Spark: every prompt three times longer) out, for --prefix-match-unit instead.
    prefix_fill_max_tokens: int = Field(default=2048, ge=1)
    prefix_reprime_interval_s: float = Field(default=5.0, ge=0)  # the least time between two primings

    @field_validator("text_user_text")
    @classmethod
    def _text_turn_holds_the_text(cls, value: str) -> str:
        if value.count("{text}") != 1 or value.replace("{text}", "").count("{") != 0:
            raise ValueError("text_user_text must hold the placeholder {text} once and no other braces")
        return value

    @model_validator(mode="after")
    def _budget_the_engine_honours(self) -> ShapingSettings:
        """Refuse a budget under which a shaped frame can fall below the engine's min_pixels: the engine
        would enlarge it, and every token figure predicted for it would be wrong."""
        grid = TokenGrid(pixels_per_token=self.pixels_per_token, token_budget=None)
        smallest = smallest_honoured_budget(grid)
        if self.image_token_budget < smallest:
            side = self.pixels_per_token
            min_tokens = math.ceil(grid.min_pixels / side**2)
            raise ValueError(
                f"MODGATE_SHAPING__IMAGE_TOKEN_BUDGET={self.image_token_budget} is below {smallest}, the "
                f"smallest budget the engine honours with {side}×{side}-pixel tokens: the engine "
                f"enlarges any frame under its min_pixels ({grid.min_pixels:,} pixels, {min_tokens} "
                "tokens), and shaping a narrow frame to whole tokens can keep just over half the budget. "
                f"Set MODGATE_SHAPING__IMAGE_TOKEN_BUDGET to {smallest} or more"
            )
        return self

    @field_validator("packed_user_text")
    @classmethod
    def _packed_text_names_the_frame_count(cls, value: str) -> str:
        try:
            value.format(frames=2)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"packed_user_text may use only the placeholder {{frames}}: {exc}") from exc
        if "{frames}" not in value:
            raise ValueError("packed_user_text must say how many frames follow: include {frames}")
        return value


class LimitsSettings(BaseModel):
    """Bounds on a request, checked before its body is parsed or its images decoded."""

    # A moderation body nests 4 deep; the JSON parser gives up near 1,000 (a 500) — refuse far earlier.
    max_json_depth: int = Field(default=32, ge=4, le=256)
    # Decoded pixels per image; at most Pillow's decompression-bomb threshold (about 89 million).
    max_image_pixels: int = Field(default=40_000_000, ge=1, le=89_000_000)


class RemoteImageSettings(BaseModel):
    """Opt-in fetching of ``http(s)`` image URLs (gateway/moderation/remote_images.py); off: data: only."""

    enabled: bool = False
    allowlist: HostList = Field(default_factory=list)  # "cdn.example.com" exactly, ".example.com" subdomains
    max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    timeout_s: float = Field(default=5.0, gt=0, le=60)  # the whole fetch: DNS, connect, redirects, body
    max_redirects: int = Field(default=3, ge=0, le=10)


def _tenant_numbers(value: object) -> object:
    """``"tenant-a=2,tenant-b=0.5"`` from the environment, or a mapping as given."""
    if not isinstance(value, str):
        return value
    numbers: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        tenant, sep, number = item.strip().rpartition("=")
        if not sep or not tenant.strip():
            raise ValueError(f"expected 'tenant=number' items separated by commas, got {item.strip()!r}")
        numbers[tenant.strip()] = number.strip()
    return numbers


TenantWeights = Annotated[dict[str, Annotated[float, Field(gt=0, le=1000)]], NoDecode,
                          BeforeValidator(_tenant_numbers)]


TenantCounts = Annotated[dict[str, Annotated[int, Field(ge=0)]], NoDecode, BeforeValidator(_tenant_numbers)]


class TenantSettings(BaseModel):
    """Per-tenant weights and quotas (``MODGATE_TENANTS__*``); ``modgate tenants set`` keeps them in Redis.

    A tenant is whatever the API keys name (``MODGATE_AUTH__API_KEYS``, ``modgate keys add``); without keys
    there is one tenant, ``default``. A value in Redis overrides the settings' for that tenant. Quota 0: none.
    """

    weights: TenantWeights = Field(default_factory=dict)  # "a=2,b=1": a's share of work is twice b's
    default_weight: float = Field(default=1.0, gt=0, le=1000)
    keyframes_per_minute: TenantCounts = Field(default_factory=dict)  # "a=600,b=60"
    default_keyframes_per_minute: int = Field(default=0, ge=0)
    max_concurrent: TenantCounts = Field(default_factory=dict)  # moderation requests at once, per replica
    default_max_concurrent: int = Field(default=0, ge=0)
    # One output token's engine time in prompt tokens. Unset: it starts at the Spark preset's effective
    # prefill / decode rates, 3,325 (a 1,076-token prefill, its weight reads included) / 97.8 tokens/s
    # (deploy/simulator/presets.py, SimPreset.output_token_weight; a test holds the two together), and is
    # learned from the served engine's calls; the built-in simulator uses its own preset's. Set: it stays
    # (docs/tenants.md).
    output_token_weight: float = Field(default=34.0, ge=0, le=1000)
    redis_key: str = Field(default="modgate:tenants", min_length=1)  # hash: tenant -> JSON limits
    reload_interval_s: float = Field(default=5.0, gt=0)  # how often Redis-held tenants are read again


class PolicySettings(BaseModel):
    """The thinking policy store: Redis (shared by every replica) when MODGATE_REDIS__URL is set."""

    key_prefix: str = Field(default="modgate:thinking-policy", min_length=1)
    reload_interval_s: float = Field(default=5.0, gt=0)  # re-read even without a pub/sub message (one lost)
    redis_timeout_s: float = Field(default=1.0, gt=0)  # a flip against a dead Redis answers 503 this fast
    reconnect_interval_s: float = Field(default=0.5, gt=0)
    audit_max_entries: int = Field(default=10000, ge=10)
