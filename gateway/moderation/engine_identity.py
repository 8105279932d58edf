"""What each engine serves, read from ``/v1/models`` and re-read: a verdict is reused only under the same.

Every engine of the pool is read, not only the first that answers: in a pool of several kinds (vLLM beside
llama.cpp) or of engines serving other weights, a verdict is kept under the model of the engine that made
it, and a lookup searches the models of the engines in the pool (docs/engines.md, verdict reuse in a
mixed pool).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.engine.pool import EnginePool
from gateway.errors import EngineUnavailable, ModgateError
from gateway.settings import EngineSettings

log = logging.getLogger("modgate.moderation")

READ_TIMEOUT_S = 5.0
"""The most one engine's ``/v1/models`` may take at a re-read: an engine that hangs keeps its last model."""


@dataclass(frozen=True, slots=True)
class EngineModel:
    """What an engine serves: its model id, the weights' root and a configured revision.

    The root is vLLM's ``root`` (the weights' path or repository); llama.cpp lists none, and its wire makes
    one of its kind and the model's size and type (``llamacpp:<n_params>:<size>:<ftype>``,
    gateway/engine/wires/), so the kind is part of the identity.
    """

    id: str
    root: str = ""
    revision: str = ""  # MODGATE_ENGINE__MODEL_REVISION

    @property
    def scope(self) -> str:
        """The model's part of the verdict-reuse scope."""
        return "\x1e".join((self.id, self.root, self.revision))


class EngineIdentity:
    """Each engine's model as last read; read again every ``engine.model_recheck_s`` s and after a failure."""

    def __init__(self, settings: EngineSettings, engines: EnginePool) -> None:
        self.settings = settings
        self.engines = engines
        self.model: EngineModel | None = None  # what requests name: the first answering engine's model
        self.models: dict[str, EngineModel] = {}  # per engine URL, as last read (kept while it cannot answer)
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Read the models again on the next request: an engine may have restarted with other weights."""
        self._read_at = float("-inf")

    def _fresh(self) -> bool:
        return self.model is not None and time.monotonic() - self._read_at < self.settings.model_recheck_s

    async def current(self) -> EngineModel:
        """The model requests name now (the first engine's that answers, open circuits last).

        A verdict is reused only under the model that made it, so new weights never serve the old ones'
        verdicts. An engine that cannot be asked keeps the last model known (its calls fail on their own).
        """
        if self._fresh():
            assert self.model is not None
            return self.model
        async with self._lock:  # concurrent requests read it once
            if not self._fresh():
                await self._read()
            assert self.model is not None
            return self.model

    def model_ids(self) -> dict[str, str]:
        """Each engine's model id by URL, as last read: what its own requests name."""
        return {url: model.id for url, model in self.models.items()}

    async def scopes(self) -> dict[str, str]:
        """Each engine's model scope by engine URL, in the pool's order (engines never read left out)."""
        await self.current()
        return {engine.url: self.models[engine.url].scope for engine in self.engines.engines
                if engine.url in self.models}

    async def _read(self) -> None:
        """Every engine's ``/v1/models`` at once; the request model is the first answering engine's."""
        engine = self.settings
        ordered = sorted(self.engines.engines, key=lambda slot: slot.state == "open")
        answers = await asyncio.gather(
            *(self._cards(slot.client.model_cards) for slot in ordered), return_exceptions=True
        )
        first: EngineModel | None = None
        failure: BaseException | None = None
        for slot, cards in zip(ordered, answers, strict=True):
            if isinstance(cards, BaseException):
                if not isinstance(cards, ModgateError):
                    raise cards
                failure = failure or cards
                continue
            if engine.model == "auto":
                if not cards:
                    failure = failure or EngineUnavailable(
                        "the engine serves no model", code="engine_no_model"
                    )
                    continue
                model_id, root = cards[0]
            else:
                model_id, root = engine.model, dict(cards).get(engine.model, "")
            found = EngineModel(model_id, root, engine.model_revision)
            known = self.models.get(slot.url)
            if known is not None and found != known:
                log.warning(
                    "the model of the engine at %s changed from %s (root %r) to %s (root %r): verdicts "
                    "made by the old one are no longer reused", slot.url, known.id, known.root, found.id,
                    found.root,
                )
            self.models[slot.url] = found
            first = first or found
        if first is None:  # no engine answered
            if self.model is None:
                if engine.model == "auto":
                    assert failure is not None
                    raise failure
                self.model = EngineModel(engine.model, "", engine.model_revision)  # named: usable
        else:
            self.model = first
        self._read_at = time.monotonic()

    @staticmethod
    async def _cards(read: Callable[[], Awaitable[list[tuple[str, str]]]]) -> list[tuple[str, str]]:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                return await read()
        except TimeoutError as exc:
            raise EngineUnavailable(f"/v1/models took longer than {READ_TIMEOUT_S:g} s") from exc
