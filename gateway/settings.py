"""Gateway settings, read from the environment: every setting is ``MODGATE_<GROUP>__<NAME>``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.console_settings import ConsoleSettings, OidcSettings
from gateway.renamed_settings import RenamedAttributes, nest_renamed_update
from shaping.bpe import Family
from shaping.tokens import TokenGrid, smallest_honoured_budget
from shaping.verdict import ACTIONS

KindSetting = Literal["auto", "vllm", "llamacpp"]
KIND_SETTINGS: Final[dict[str, KindSetting]] = {"auto": "auto", "vllm": "vllm", "llamacpp": "llamacpp"}
"""MODGATE_ENGINE__KIND's values (gateway/engine/wires/ has a wire per kind): a name, never a branch."""


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


class EngineSettings(BaseModel):
    """How the gateway talks to the engine."""

    url: str | None = None  # unset: the built-in simulated engine; "http://a:8000,http://b:8000": two
    caps: str | None = None  # "http://a:8000=8,http://b:8000=4"; an engine not listed: max_inflight
    max_inflight: int = Field(default=8, ge=1, le=1024)  # requests in flight to each engine
    model: str = "auto"  # "auto": the first model the engine lists at /v1/models
    connect_timeout_s: float = Field(default=2.0, gt=0)
    first_token_timeout_s: float = Field(default=30.0, gt=0)
    total_timeout_s: float = Field(default=120.0, gt=0)
    connect_retries: int = Field(default=3, ge=0, le=10)
    max_completion_tokens_thinking: int = Field(default=512, ge=1)
    max_completion_tokens_direct: int = Field(default=64, ge=1)
    verdict_constraint: Literal["json_schema", "regex"] = "json_schema"  # how the JSON verdict format is held
    # Alternatives asked per generated token (vLLM's top_logprobs, at most its --max-logprobs, default 20):
    # the verdict's confidence is read from them (shaping.confidence). 0: none asked, confidence is null;
    # fewer than the actions cannot show each action's first token and is refused (_sees_every_action).
    top_logprobs: int = Field(default=10, ge=0, le=20)
    # llama.cpp only (logprobs not grammar-masked): the most probe calls a verdict may cost where the
    # answer's own list cannot give its exact confidence (shaping.confidence, moderation/engine_call.py);
    # each is one more prefill of the request, images included. 0: no probe, that confidence stays null.
    place_probes: int = Field(default=2, ge=0, le=10)
    use_priority: bool = False  # needs the engine started with --scheduling-policy priority
    # What served the verdicts, part of the verdict-reuse scope with the model's id and root (/v1/models):
    # set it when new weights go live under the same name and path (e.g. the weights' commit).
    model_revision: str = Field(default="", max_length=200)
    model_recheck_s: float = Field(default=5.0, ge=0)  # /v1/models re-read this often (0: every request)
    # Which server each engine is (gateway/engine/wires/): "auto" detects it from GET /props; `kinds`
    # sets it per engine URL ("http://a:8000=vllm,http://b:8080=llamacpp"), over `kind`.
    kind: KindSetting = "auto"
    kinds: str | None = None
    # At start, ask each engine two small chat completions and read its /v1/models and /metrics, and say
    # once what it lacks with the flag that fixes it (gateway/engine/startup_check.py). Off: nothing asked.
    startup_check: bool = True

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        urls = [url.strip().rstrip("/") for url in value.split(",") if url.strip()]
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"MODGATE_ENGINE__URL must start with http:// or https://, got {url!r}")
        if len(set(urls)) != len(urls):
            raise ValueError("MODGATE_ENGINE__URL lists an engine twice")
        return ",".join(urls) or None

    @field_validator("caps")
    @classmethod
    def _caps_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        for item in value.split(","):
            url, sep, cap = item.strip().rpartition("=")
            if not sep or not url or not cap.strip().isdigit() or int(cap) < 1:
                raise ValueError("MODGATE_ENGINE__CAPS must look like 'http://a:8000=8,http://b:8000=4'")
        return value

    @model_validator(mode="after")
    def _caps_name_configured_engines(self) -> EngineSettings:
        extra = set(self.cap_map()) - set(self.urls())
        if extra:
            raise ValueError(f"MODGATE_ENGINE__CAPS names engines MODGATE_ENGINE__URL lacks: {sorted(extra)}")
        return self

    def urls(self) -> list[str]:
        """The configured engines, in order (empty: the built-in simulated engine)."""
        return self.url.split(",") if self.url else []

    def cap_map(self) -> dict[str, int]:
        """Caps set in MODGATE_ENGINE__CAPS, by engine URL."""
        if self.caps is None:
            return {}
        pairs = (item.strip().rpartition("=") for item in self.caps.split(","))
        return {url.strip().rstrip("/"): int(cap) for url, _, cap in pairs}

    @field_validator("kinds")
    @classmethod
    def _kinds_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        for item in value.split(","):
            url, sep, kind = item.strip().rpartition("=")
            if not sep or not url or kind.strip() not in KIND_SETTINGS:
                raise ValueError(
                    "MODGATE_ENGINE__KINDS must look like 'http://a:8000=vllm,http://b:8080=llamacpp' "
                    f"(each kind auto, vllm or llamacpp), got {item.strip()!r}"
                )
        return value

    def kind_of(self, url: str) -> KindSetting:
        """An engine's kind: its MODGATE_ENGINE__KINDS entry, else MODGATE_ENGINE__KIND."""
        for item in (self.kinds or "").split(","):
            listed, _, kind = item.strip().rpartition("=")
            if listed.strip().rstrip("/") == url.rstrip("/"):
                return KIND_SETTINGS.get(kind.strip(), "auto")
        return self.kind

    @field_validator("top_logprobs")
    @classmethod
    def _sees_every_action(cls, value: int) -> int:
        """Refused: a ``top_logprobs`` that cannot list each action's first token at the verdict's start."""
        if 0 < value < len(ACTIONS):
            raise ValueError(
                f"MODGATE_ENGINE__TOP_LOGPROBS={value} is too small to see each action's first token: the "
                f"verdict's confidence needs at least {len(ACTIONS)} alternatives per token "
                f"({', '.join(ACTIONS)}), or 0 to ask for no logprobs (confidence null)"
            )
        return value


class AdmissionSettings(BaseModel):
    """The queue in front of the engine's in-flight cap."""

    queue_size: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0)
    # "tenant": each tenant its weighted share of engine work (and of the shaping threads); "fifo": one
    # shared queue, priority then arrival (docs/tenants.md)
    fairness: Literal["tenant", "fifo"] = "tenant"


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


class CircuitSettings(BaseModel):
    """When the gateway stops calling a failing engine, and for how long (gateway/engine/circuit.py)."""

    consecutive_failures: int = Field(default=5, ge=1)
    failure_rate: float = Field(default=0.5, gt=0, le=1)  # of the last ``window`` calls (``min_calls`` ran)
    window: int = Field(default=20, ge=1)
    min_calls: int = Field(default=10, ge=1)
    cooldown_s: float = Field(default=5.0, gt=0)


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


class JobSettings(BaseModel):
    """Keyframe batches submitted as jobs (gateway/jobs/): durable in Redis streams when Redis is set."""

    max_frames: int = Field(default=64, ge=1, le=1024)
    max_backlog: int = Field(default=10_000, ge=1)  # jobs queued or running before a submission gets 429
    concurrency: int = Field(default=2, ge=1, le=64)  # jobs worked at once by each gateway
    priority: int = Field(default=5, ge=-10, le=10)  # admission priority of job frames (live calls use 0)
    claim_idle_s: float = Field(default=60.0, gt=0)  # a job silent this long on its gateway is taken over
    max_attempts: int = Field(default=5, ge=1, le=50)  # engine failures before a job is marked failed
    retry_wait_s: float = Field(default=1.0, gt=0)  # first back-off between attempts (doubling, jittered)
    result_ttl_s: int = Field(default=7 * 86400, ge=60)  # how long a finished job and its key are kept
    webhook_secret: SecretStr | None = None  # signs webhooks; unset: webhook_url is refused
    webhook_allowlist: HostList = Field(default_factory=list)  # hosts a webhook may go to (operator-trusted)
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    webhook_attempts: int = Field(default=5, ge=1, le=20)
    # At shutdown: how long running jobs may go on; the rest go back to the stream for another gateway.
    stop_grace_s: float = Field(default=10.0, ge=0, le=600)
    # Replicas that must hold a job (WAIT) before it is answered 202 or its completion counts (0: none).
    wait_replicas: int = Field(default=0, ge=0, le=16)
    wait_timeout_ms: int = Field(default=1000, ge=1, le=4_000)  # WAIT's limit: within Redis's 5 s timeout

    @field_validator("webhook_secret")
    @classmethod
    def _webhook_secret_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return None
        if len(value.get_secret_value()) < 16:
            raise ValueError("MODGATE_JOBS__WEBHOOK_SECRET must be at least 16 characters")
        return value


class VideoSettings(BaseModel):
    """Videos posted as jobs (gateway/jobs/video.py, cut by shaping/video/): their limits and the cut."""

    # A JSON body carries the video base64-encoded (4/3 of its size) within MODGATE_SHAPING__MAX_BODY_BYTES.
    max_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_duration_s: float = Field(default=600.0, gt=0)
    max_pixels: int = Field(default=3840 * 2160, ge=1)  # per frame: 4K
    max_fps: float = Field(default=1.0, gt=0, le=60)  # frames cut per second of video at most (the default)
    # Mean grey-level change (0..1) that counts as a shot change; 0: the stream's own keyframes only.
    scene_threshold: float = Field(default=0.3, ge=0, le=1)
    cut_budget_s: float = Field(default=120.0, gt=0)  # the cut of one video, after which the job fails
    cut_workers: int = Field(default=1, ge=1, le=16)  # videos cut at once (threads of their own)
    fetch_timeout_s: float = Field(default=60.0, gt=0, le=600)  # a video URL's whole download


class TelemetrySettings(BaseModel):
    """Traces, metrics, logs and the recent-window figures (gateway/telemetry/: tracing.py, windows.py)."""

    otlp_endpoint: str | None = None  # "http://collector:4318": OTLP/HTTP traces and metrics; unset: none
    service_name: str = "modgate"
    # The window of GET /stats and of the windowed cache rates: long enough for stable percentiles, short
    # enough that a burst of probes an hour ago does not colour what production gets now.
    window_s: float = Field(default=300.0, gt=0, le=86400)
    engine_scrape_interval_s: float = Field(default=15.0, ge=0)  # reads of the engine's /metrics; 0: never
    json_logs: bool = False  # one JSON object per log line (request ids; never image bytes or keys)

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint_is_http(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"MODGATE_TELEMETRY__OTLP_ENDPOINT must start with http:// or https://, got {value!r}"
            )
        return value.rstrip("/")


class PolicySettings(BaseModel):
    """The thinking policy store: Redis (shared by every replica) when MODGATE_REDIS__URL is set."""

    key_prefix: str = Field(default="modgate:thinking-policy", min_length=1)
    reload_interval_s: float = Field(default=5.0, gt=0)  # re-read even without a pub/sub message (one lost)
    redis_timeout_s: float = Field(default=1.0, gt=0)  # a flip against a dead Redis answers 503 this fast
    reconnect_interval_s: float = Field(default=0.5, gt=0)
    audit_max_entries: int = Field(default=10000, ge=10)


class LeaseSettings(BaseModel):
    """Engine slots the gateway replicas share in Redis (gateway/engine/leases.py) with MODGATE_REDIS__URL."""

    enabled: bool = True  # off: each replica keeps each engine's cap on its own (N replicas, N × the cap)
    key_prefix: str = Field(default="modgate:engine-leases", min_length=1)
    ttl_s: float = Field(default=10.0, gt=0)  # a crashed replica's slots free themselves within this
    renew_every_s: float = Field(default=3.0, gt=0)
    redis_timeout_s: float = Field(default=0.5, gt=0)
    retry_after_failure_s: float = Field(default=5.0, gt=0)  # local caps only, this long after Redis failed
    # The next free slot goes to the tenant served least across every replica (Redis decides, with the
    # lease); off: each replica shares its own slots between its own tenants, and replicas race for leases.
    fair_share: bool = True

    @model_validator(mode="after")
    def _renewed_before_expiry(self) -> LeaseSettings:
        if self.renew_every_s >= self.ttl_s:
            raise ValueError("MODGATE_LEASES__RENEW_EVERY_S must be shorter than MODGATE_LEASES__TTL_S")
        return self


class QualitySettings(BaseModel):
    """Where shadow pairs (the policy's ``shadow_share`` of live frames, judged in both modes) are kept."""

    records_dir: Path = Path("var/quality/records")  # one JSONL file per ISO week, read by the weekly report
    redis_stream: str = "modgate:quality:records"  # mirrored there when MODGATE_REDIS__URL is set


class DecisionSettings(BaseModel):
    """The decision log (docs/decisions.md): each decision on a Redis stream, then in daily Parquet files."""

    stream: str = Field(default="modgate:decisions", min_length=1)  # with MODGATE_REDIS__URL
    archive_dir: Path = Path("var/decisions")  # one folder of Parquet files per UTC day
    archive_after_s: float = Field(default=3600.0, ge=0)  # stream entries older than this move to Parquet
    archive_interval_s: float = Field(default=300.0, gt=0)  # how often a replica tries to move them
    retention_days: int = Field(default=400, ge=1)  # day folders older than this are deleted
    redis_timeout_s: float = Field(default=0.5, gt=0)  # an append waits no longer (the answer goes out)
    # a failed append is tried again in the background (never on the answer's time) this many times in all,
    # for at most this long, then counted in modgate_decisions_unlogged_total
    retry_attempts: int = Field(default=8, ge=1)
    retry_timeout_s: float = Field(default=60.0, gt=0)
    # Replicas that must hold an append (WAIT): one not held in time is tried again like a failed one.
    wait_replicas: int = Field(default=0, ge=0, le=16)


class ShadowSettings(BaseModel):
    """A second engine for shadow pairs: the policy's ``shadow_share`` of live frames is judged there too, in
    the live thinking mode and verdict format, so one engine's verdicts are measured against the other's."""

    engine_url: str | None = None  # unset: shadow pairs only on the live engines, in the other thinking mode
    # VerdictRecord.engine of its records until its kind is detected (GET /props)
    engine_kind: Literal["vllm", "llamacpp"] = "llamacpp"
    max_inflight: int = Field(default=8, ge=1, le=1024)  # the second engine's cap (llama.cpp: its slots)

    @field_validator("engine_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"MODGATE_SHADOW__ENGINE_URL must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class ReviewSettings(BaseModel):
    """The review queue (gateway/review/): frames people label, in Redis streams when Redis is set."""

    enabled: bool = True
    # A block or allow whose confidence is under this goes to the queue as unsure (0: none do). The
    # per-tenant moderation policy's ``review_below`` takes over where it is set.
    review_below: float = Field(default=0.0, ge=0, le=1)
    # The share of confident verdicts sampled for audit, so accuracy is measured where the model is sure.
    audit_sample_rate: float = Field(default=0.0, ge=0, le=1)
    # The share of audit samples queued twice (two items, one decision), so two reviewers label the same
    # frame and the weekly report gives their agreement (Cohen's kappa) beside the model's accuracy.
    double_label_share: float = Field(default=0.0, ge=0, le=1)
    # A claim not labelled this long returns to the queue: the next reviewer who asks takes it over.
    claim_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    # How long an item (and its frame) is kept unlabelled; a labelled item's frame is deleted at once.
    retention_s: int = Field(default=7 * 86400, ge=60, le=90 * 86400)
    # An alert fires when the oldest waiting item is older than this (deploy/monitoring/).
    oldest_alert_s: float = Field(default=3600.0, gt=0)
    # Without Redis: items kept in memory, each with its frame (~100 KB); past this the oldest is dropped.
    memory_max_items: int = Field(default=1000, ge=1, le=100_000)
    # Replicas that must hold a queued item before its verdict is answered (else modgate_review_unreplicated)
    wait_replicas: int = Field(default=0, ge=0, le=16)
    wait_timeout_ms: int = Field(default=200, ge=1, le=4_000)  # WAIT's limit: within Redis's 5 s timeout


class SimulatorSettings(BaseModel):
    """The built-in simulated engine that `modgate serve` starts when no engine URL is set."""

    # spark: the Spark's hybrid model, started with --prefix-match-unit 16 (the gateway primes it)
    preset: Literal["spark", "vllm-cpu", "instant"] = "spark"
    time_scale: float = Field(default=0.02, ge=0)
    tokenizer: Family | None = None  # whose BPE the simulator counts with; None: the preset's (qwen3.6)


class ServerSettings(BaseModel):
    """The gateway's own HTTP server: where it listens, how it logs and how it stops."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # How long an idle client connection stays open. Longer than the pools of common clients (httpx 5 s,
    # aiohttp 15 s, nginx's and AWS ALB's upstream 60 s, Go's net/http 90 s): a client then always drops an
    # idle connection before the server does, and never sends a request into one the server is closing
    # (the server's old 5 s equalled httpx's expiry: "Server disconnected without sending a response").
    keep_alive_s: int = Field(default=120, ge=1, le=3600)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # After SIGTERM: seconds /readyz answers 503 while requests are still served (gateway/drain.py).
    drain_s: float = Field(default=5.0, ge=0, le=600)
    model_name: str = "modgate-moderation"  # the name answered in the moderation response


class RedisSettings(BaseModel):
    """The Redis every replica shares: policy, keys, jobs, leases, reviews and the decision log."""

    url: str | None = None  # unset: in-memory state

    @field_validator("url")
    @classmethod
    def _url_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        from gateway.state import check_redis_url  # redis-py is imported only where a URL is given

        check_redis_url(value.strip())  # redis://, rediss://, unix:// or redis+sentinel:// (gateway/state.py)
        return value.strip()


class AuthSettings(BaseModel):
    """Who may call the gateway: API keys for /v1, the admin token for /admin and the console."""

    api_keys: str | None = None  # "key1:tenant1,key2:tenant2"; unset: no key required (said loudly)
    api_keys_from_redis: bool = False  # also accept keys added with `modgate keys add`; keys always required
    # the bearer token of /admin and the console: at least 16 characters, else the gateway does not start
    admin_token: str | None = None

    @field_validator("api_keys")
    @classmethod
    def _api_keys_well_formed(cls, value: str | None) -> str | None:
        if value is None or value.strip() == "":
            return None
        for item in value.split(","):
            key, sep, tenant = item.strip().partition(":")
            if not sep or not key or not tenant:
                raise ValueError("MODGATE_AUTH__API_KEYS must look like 'key1:tenant1,key2:tenant2'")
        return value

    @field_validator("admin_token")
    @classmethod
    def _admin_token_long_enough(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if len(value) < 16:
            raise ValueError("MODGATE_AUTH__ADMIN_TOKEN must be at least 16 characters")
        return value


class Settings(RenamedAttributes, BaseSettings):
    """Everything the gateway reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="MODGATE_", env_nested_delimiter="__", extra="ignore")

    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    redis: RedisSettings = RedisSettings()
    auth: AuthSettings = AuthSettings()
    admission: AdmissionSettings = AdmissionSettings()
    shaping: ShapingSettings = ShapingSettings()
    simulator: SimulatorSettings = SimulatorSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    circuit: CircuitSettings = CircuitSettings()
    limits: LimitsSettings = LimitsSettings()
    remote_images: RemoteImageSettings = RemoteImageSettings()
    jobs: JobSettings = JobSettings()
    videos: VideoSettings = VideoSettings()
    policy: PolicySettings = PolicySettings()
    console: ConsoleSettings = ConsoleSettings()
    oidc: OidcSettings = OidcSettings()
    leases: LeaseSettings = LeaseSettings()
    quality: QualitySettings = QualitySettings()
    shadow: ShadowSettings = ShadowSettings()
    tenants: TenantSettings = TenantSettings()
    review: ReviewSettings = ReviewSettings()
    decisions: DecisionSettings = DecisionSettings()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; an old flat name (``engine_url``) updates its group's field."""
        return super().model_copy(update=update and nest_renamed_update(self, update), deep=deep)

    @model_validator(mode="after")
    def _redis_keys_need_redis(self) -> Settings:
        if self.auth.api_keys_from_redis and not self.redis.url:
            raise ValueError("MODGATE_AUTH__API_KEYS_FROM_REDIS needs MODGATE_REDIS__URL")
        return self

    @model_validator(mode="after")
    def _sign_in_sessions_need_the_admin_token(self) -> Settings:
        if self.oidc.issuer is not None and self.auth.admin_token is None:
            raise ValueError(
                "MODGATE_OIDC__ISSUER needs MODGATE_AUTH__ADMIN_TOKEN (it signs console sessions)")
        return self

    def tenant_keys(self) -> dict[str, str]:
        """The configured API keys, mapped to their tenant."""
        if self.auth.api_keys is None:
            return {}
        pairs = (item.strip().partition(":") for item in self.auth.api_keys.split(","))
        return {key: tenant for key, _, tenant in pairs}
