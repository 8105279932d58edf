"""What the engine serves, read from ``/v1/models`` and re-read: a verdict is reused only under the same."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway.engine.pool import EnginePool
from gateway.errors import EngineUnavailable, ModgateError
from gateway.settings import EngineSettings

log = logging.getLogger("modgate.moderation")


@dataclass(frozen=True, slots=True)
class EngineModel:
    """What the engine serves: its model id, the weights' root (vLLM's ``root``) and a configured revision."""

    id: str
    root: str = ""
    revision: str = ""  # MODGATE_ENGINE__MODEL_REVISION

    @property
    def scope(self) -> str:
        """The model's part of the verdict-reuse scope."""
        return "\x1e".join((self.id, self.root, self.revision))


class EngineIdentity:
    """The engine's model as last read; read again every ``engine.model_recheck_s`` s and after a failure."""

    def __init__(self, settings: EngineSettings, engines: EnginePool) -> None:
        self.settings = settings
        self.engines = engines
        self.model: EngineModel | None = None  # read from /v1/models, again every engine.model_recheck_s
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Read the model again on the next request: the engine may have restarted with other weights."""
        self._read_at = float("-inf")

    async def current(self) -> EngineModel:
        """What the engine serves now (it may have restarted with other weights since the last read).

        A verdict is reused only under the same identity, so new weights never serve the old ones' verdicts.
        An engine that cannot be asked keeps the last identity known (its calls fail on their own).
        """
        engine = self.settings
        if self.model is not None and time.monotonic() - self._read_at < engine.model_recheck_s:
            return self.model
        async with self._lock:  # concurrent requests read it once
            if self.model is not None and time.monotonic() - self._read_at < engine.model_recheck_s:
                return self.model
            try:
                cards = await self.engines.model_cards()
            except ModgateError:
                if self.model is None:
                    if engine.model == "auto":
                        raise
                    self.model = EngineModel(engine.model, "", engine.model_revision)  # named: usable
                self._read_at = time.monotonic()
                return self.model
            if engine.model == "auto":
                if not cards:
                    raise EngineUnavailable("the engine serves no model", code="engine_no_model")
                model_id, root = cards[0]
            else:
                model_id, root = engine.model, dict(cards).get(engine.model, "")
            found = EngineModel(model_id, root, engine.model_revision)
            if self.model is not None and found != self.model:
                log.warning(
                    "the engine's model changed from %s (root %r) to %s (root %r): verdicts made by the "
                    "old one are no longer reused", self.model.id, self.model.root, found.id, found.root,
                )
            self.model, self._read_at = found, time.monotonic()
            return found
