"""One small protocol per engine kind: what differs between the engines the gateway speaks to.

The moderation path builds one request (vLLM's OpenAI-compatible shape, shaping/prompt.py) and reads one
answer shape (gateway/engine/client.py); an :class:`EngineWire` turns the first into what its engine
takes and reads what its engine serves: the request shape, its busy answers, its cache counters, its slots
and props, the start-up check's hints, the prefix strategy's inputs, the cache probe's diagnosis, the
confidence reading and token counting. Nothing outside this package asks which kind it talks to; the
kind is a label (a metric's, ``/readyz``'s) and never a branch (tests/layout/test_engine_seam.py).

- vLLM: :mod:`gateway.engine.wires.vllm`.
- llama.cpp's ``llama-server``: :mod:`gateway.engine.wires.llamacpp` (its grammar: ``gbnf``).

The kind is detected per engine from ``GET /props`` (each wire says whether an answer is its engine's,
:meth:`EngineWire.claims_props`; none claiming it: vLLM, which serves no ``/props``) unless set with
``MODGATE_ENGINE__KIND`` or per engine URL with ``MODGATE_ENGINE__KINDS``; the client detects it once and
again after a failed call or when the engine's ``/props`` changes (a restart or a swap).

A third engine kind is one more module here: a subclass of :class:`EngineWire` that overrides what its
engine does differently, passed to :func:`register` in this file (tests/multi_engine's toy wire
shows it); the setting's ``Literal`` names it so an operator may set it.
"""

from __future__ import annotations

from gateway.engine.wires.base import (
    DEFAULT_KIND,
    ENGINE_KINDS,
    IMAGE_TOKENS_UNCOUNTED,
    WIRES,
    CacheProbeText,
    EngineKind,
    EngineKindSetting,
    EngineWire,
    StartupHints,
    TokenizeStep,
    busy_answers,
    kind_from_props,
    read_cache_config,
    register,
    wire_for,
)
from gateway.engine.wires.llamacpp import LlamaCppWire
from gateway.engine.wires.vllm import VllmWire

# The built-in kinds, in the order detection asks them (a new kind: its module, and one line here).
register(VllmWire())
register(LlamaCppWire())

__all__ = [
    "DEFAULT_KIND", "ENGINE_KINDS", "IMAGE_TOKENS_UNCOUNTED", "WIRES", "CacheProbeText", "EngineKind",
    "EngineKindSetting", "EngineWire", "LlamaCppWire", "StartupHints", "TokenizeStep", "VllmWire",
    "busy_answers", "kind_from_props", "read_cache_config", "register", "wire_for",
]
