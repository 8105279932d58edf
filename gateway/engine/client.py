"""The engine client: one OpenAI-compatible engine server, streamed so the first token is seen when it comes.

Which server (vLLM or llama.cpp's) is its :class:`~gateway.engine.wires.EngineWire`: set, or detected from
``GET /props`` on first use; the wire reshapes the request body and reads what differs.

Connect errors are retried (the engine never saw the request); nothing is retried once the engine has
started answering. Deadlines: connect, first token, total. Every failure is translated into the gateway's
exception tree here, at the boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Final, Self

import httpx
import orjson
import stamina

from gateway.engine import calls
from gateway.engine.answers import EngineAnswer, engine_failed, error_message, logprob_entries, refusal_error
from gateway.engine.calls import PURPOSE_KEY, CallObserver, CountedTransport, Purpose
from gateway.engine.circuit import CircuitBreaker, CircuitOpen
from gateway.engine.stream_lines import engine_json, sse_lines
from gateway.engine.transport import EngineTransport
from gateway.engine.usage import PlaceAnswer, Usage
from gateway.engine.wires import DEFAULT_KIND, EngineKindSetting, EngineWire, kind_from_props, wire_for
from gateway.errors import EngineUnavailable, ServerSideError, UpstreamError, UpstreamTimeout
from shaping.confidence import TokenLogprob


@dataclass
class _StreamState:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    first_token_at: float | None = None
    done: bool = False


_READS: Final = frozenset({"props", "metrics", "health", "models", "tokenize"})
"""Purposes that read the engine without running the model: outside the circuit (how it is found back)."""

ENGINE_KEEPALIVE_S = 2.0
"""How long an idle engine connection is kept: under the engine servers' own keep-alive (vLLM's uvicorn
5 s, ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``; llama.cpp's cpp-httplib 5 s), so the gateway drops it first and
never sends a request into one the engine is closing. httpx's default, 5 s, equals theirs: that race is
"Server disconnected without sending a response" on a pooled connection."""


class EngineClient:
    """Talks to one engine over a shared ``httpx.AsyncClient`` (on its own connection pool unless a test
    passes its own ``transport``: :mod:`gateway.engine.transport`)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        first_token_timeout_s: float,
        total_timeout_s: float,
        connect_retries: int,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None = None,
        circuit: CircuitBreaker | None = None,
        kind: EngineKindSetting = "auto",
        props_recheck_s: float = 30.0,
    ) -> None:
        self.base_url = base_url
        self.circuit = circuit
        self.connect_timeout_s = connect_timeout_s
        self._kind = kind
        self._wire: EngineWire | None = None if kind == "auto" else wire_for(kind)
        # llama.cpp's /props is read again this often (its --parallel slots are the engine's cap, across
        # replicas the cap of its leases) and on the next call after one failed: a llama-server restarted
        # with other flags serves other slots under the same URL
        self.props_recheck_s = props_recheck_s
        self._props_read_at: float | None = None  # None: not read since start or since a call failed
        self.slots: int | None = None  # llama.cpp's --parallel slots, from /props (None: not said)
        self.vision: bool | None = None  # whether /props says the server takes images (None: not said)
        self.first_token_timeout_s = first_token_timeout_s
        self.total_timeout_s = total_timeout_s
        self.connect_retries = connect_retries
        # idle connections dropped before the engine's own keep-alive closes them (ENGINE_KEEPALIVE_S): a
        # call sent on a connection the engine is closing fails mid-answer (502) and is not retried
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                              keepalive_expiry=ENGINE_KEEPALIVE_S)
        # every request counted once and timed, with the request id it serves (gateway/engine/calls.py)
        self._counted = CountedTransport(transport or EngineTransport(limits), base_url)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(total_timeout_s, connect=connect_timeout_s),
            limits=limits,
            transport=self._counted,
        )
        # The verdict call's request as the client would build it (URL under the base, the client's headers
        # and timeouts), made once: see _exchange.
        self._chat_url = self._http.build_request("POST", "/v1/chat/completions").url
        # made once (httpx normalises every header of a plain dict again on each request); copied per call
        self._chat_headers = httpx.Headers({**self._http.headers, "Content-Type": "application/json"})
        self._chat_timeout = self._http.timeout.as_dict()

    def count_calls(self, observe: CallObserver) -> None:
        """Report every call to this engine to ``observe`` (``modgate_engine_calls_total``)."""
        self._counted.observe = observe

    def _refused(self, purpose: Purpose) -> None:
        """A call the circuit refused before sending: counted, though nothing reached the engine."""
        if self._counted.observe is not None:
            self._counted.observe(self.base_url, purpose, "circuit_open", 0.0)

    def _short_timeout(self) -> httpx.Timeout:
        """For a read that says whether the engine is there (``/health``, ``/props``): the connect timeout."""
        return httpx.Timeout(self.connect_timeout_s)

    async def request(
        self,
        method: str,
        path: str,
        *,
        purpose: Purpose,
        json: Any = None,
        request_id: str | None = None,
    ) -> httpx.Response:
        """One request to the engine for ``purpose``, answered as it came (the caller reads the status).

        Those that run the model (``probe``, ``primer``, ``check``) go through the circuit breaker: refused
        while it is open, and the engine's failures count. A request the engine never answered makes the
        next call read ``/props`` again (a restart or a swap may have changed the engine behind the URL)."""
        headers = {"X-Request-Id": request_id} if request_id else None
        circuit = None if purpose in _READS else self.circuit
        try:
            probe = False if circuit is None else circuit.before_call()
        except CircuitOpen:
            self._refused(purpose)
            raise
        try:
            response = await self._translated(
                self._http.request(
                    method, path, json=json, headers=headers, extensions={PURPOSE_KEY: purpose}
                ),
                path,
            )
        except ServerSideError:
            if circuit is not None:
                circuit.record_failure(probe)
            raise
        except BaseException:
            if circuit is not None:
                circuit.record_abandoned(probe)
            raise
        if circuit is not None:
            failed = response.status_code >= 500 and not self._says_busy(response)
            if failed:
                circuit.record_failure(probe)
            else:
                circuit.record_success(probe)
        return response

    def _says_busy(self, response: httpx.Response) -> bool:
        """Whether an error answer is the engine's back-pressure (its wire's busy answers)."""
        wire = self._wire or wire_for(DEFAULT_KIND)
        return wire.says_busy(response.status_code, error_message(response))

    async def _translated(self, send: Awaitable[httpx.Response], path: str) -> httpx.Response:
        try:
            response: httpx.Response = await send
        except httpx.TimeoutException as exc:
            self._props_read_at = None
            raise UpstreamTimeout(f"engine {path} timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            self._props_read_at = None
            raise EngineUnavailable(f"engine {path} failed: {exc!r}") from exc
        return response

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def _props_due(self) -> bool:
        """Whether ``/props`` should be read before this call: never for a told vLLM (it serves none); for
        an engine not read yet or since a failed call; for llama.cpp every ``props_recheck_s``."""
        if self._kind != "auto" and not wire_for(self._kind).props_recheck:
            return False  # told a kind whose /props says nothing (vLLM serves none)
        if self._wire is None or self._props_read_at is None:
            return True
        since = time.monotonic() - self._props_read_at
        return self._wire.props_recheck and since >= self.props_recheck_s

    async def wire(self) -> EngineWire:
        """This engine's protocol, from its kind as set or detected from ``GET /props``, with what llama.cpp's
        ``/props`` says of its slots and vision (a loading or unreachable engine is asked again)."""
        if not self._props_due():
            assert self._wire is not None
            return self._wire
        try:
            response = await self._http.get(
                "/props", timeout=self._short_timeout(), extensions={PURPOSE_KEY: "props"}
            )
            payload = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return self._wire or wire_for(DEFAULT_KIND)  # not known yet: as last known, ask again next time
        if response.status_code == 503:
            # llama-server answers 503 while loading (vLLM serves no /props): its slots are read once loaded
            return self._wire or wire_for(kind_from_props(503, None))
        told = None if self._kind == "auto" else wire_for(self._kind)
        wire = told or wire_for(kind_from_props(response.status_code, payload))
        total = payload.get("total_slots") if isinstance(payload, dict) else None
        self.slots = total if isinstance(total, int) and total > 0 else None
        modalities = payload.get("modalities") if isinstance(payload, dict) else None
        self.vision = bool(modalities.get("vision")) if isinstance(modalities, dict) else None
        self._wire, self._props_read_at = wire, time.monotonic()
        return wire

    async def read_slots(self) -> bool:
        """Read ``/props`` now, whatever its age, before a slot of the cap is taken (engine/slot_readings.py):
        whether it answered, so that ``slots`` is the engine's word of now (None: it names none, as vLLM)."""
        if self._kind == "vllm":
            return True  # it serves no /props: its cap is the setting
        self._props_read_at = None
        await self.wire()
        return self._props_read_at is not None

    @property
    def kind(self) -> str:
        """The engine kind, or "unknown" before it was detected."""
        return "unknown" if self._wire is None else self._wire.kind

    @property
    def counts_image_tokens(self) -> bool:
        """Whether its token count and usage include images, as far as it is known (undetected: yes)."""
        return self._wire is None or self._wire.counts_image_tokens

    async def model_ids(self) -> list[str]:
        """The served models (``GET /v1/models``)."""
        return [model_id for model_id, _ in await self.model_cards()]

    async def model_cards(self) -> list[tuple[str, str]]:
        """The served models as ``(id, root)``: vLLM's ``root`` is the weights' path or repository."""
        response = await self._get("/v1/models", "models")
        wire = await self.wire()
        try:
            return [(str(item["id"]), wire.model_root(item)) for item in response.json()["data"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UpstreamError(f"engine /v1/models answered an unexpected body: {exc}") from exc

    async def healthy(self) -> bool:
        """``GET /health`` answers 200."""
        try:
            response = await self._http.get(
                "/health", timeout=self._short_timeout(), extensions={PURPOSE_KEY: "health"}
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def metrics_text(self) -> str:
        """The engine's Prometheus ``/metrics`` text."""
        return (await self._get("/metrics", "metrics")).text

    async def server_info(self) -> dict[str, Any] | None:
        """vLLM's ``GET /server_info?config_format=json`` (served with ``VLLM_SERVER_DEV_MODE=1``): its whole
        config; None where the engine serves no such route or its body is not a JSON object."""
        try:
            response = await self._http.get(
                "/server_info", params={"config_format": "json"}, extensions={PURPOSE_KEY: "props"}
            )
            body = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    async def tokenize(self, body: dict[str, Any], request_id: str | None = None) -> int:
        """Token count of a prompt or messages (``POST /tokenize``, in the engine's own terms)."""
        wire = await self.wire()
        steps = wire.tokenize_steps(body)
        payload: dict[str, Any] = {}
        for path, make_body in steps:
            response = await self.request(
                "POST", path, purpose="tokenize", json=make_body(payload), request_id=request_id
            )
            if response.status_code != 200:
                raise UpstreamError(
                    f"engine {path} answered {response.status_code}: {error_message(response)}"
                )
            payload = response.json()
        return wire.token_count(payload)

    async def probe_chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One small chat completion outside admission and the circuit, answered as (status, JSON body):
        the start-up checks (gateway/engine/startup_check.py) read fields the moderation path does not."""
        body = (await self.wire()).chat_body(body)
        response = await self.request("POST", "/v1/chat/completions", purpose="check", json=body)
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": {"message": response.text[:200]}}
        return response.status_code, payload if isinstance(payload, dict) else {}

    async def verdict_place(
        self, body: dict[str, Any], before: str, regex: str, request_id: str | None = None
    ) -> PlaceAnswer | None:
        """The grammar's distribution at a verdict's first token where the wire can ask for it (its
        ``place_probe``), with the probe's usage; None where the wire cannot ask. A probe the engine did not
        answer reads no distribution (the verdict then keeps no confidence: a probe never fails the call)."""
        wire = await self.wire()
        probe = wire.place_probe(body, before, regex)
        if probe is None:
            return None
        try:
            response = await self.request(
                "POST", "/v1/chat/completions", purpose="probe", json=probe, request_id=request_id
            )
            payload = response.json() if response.status_code == 200 else None
        except (ServerSideError, ValueError):
            return PlaceAnswer(None, Usage())
        if not isinstance(payload, dict):
            return PlaceAnswer(None, Usage())
        usage = payload.get("usage")
        cost = Usage.from_wire(usage if isinstance(usage, dict) else None, wire.counts_image_tokens)
        return PlaceAnswer(wire.read_place(payload), cost)

    async def probe_stream(self, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """:meth:`probe_chat` streamed, answered as (status, the chunks): a streamed answer is where both
        engines put an unfinished thought in its own field (llama.cpp's final answer folds it in content)."""
        body = (await self.wire()).chat_body({**body, "stream": True})
        chunks: list[dict[str, Any]] = []
        try:
            async with self._http.stream(
                "POST", "/v1/chat/completions", json=body, extensions={PURPOSE_KEY: "check"}
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    return response.status_code, []
                async for line in response.aiter_lines():
                    data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                    if data and data != "[DONE]":
                        with contextlib.suppress(ValueError):
                            chunk = json.loads(data)
                            if isinstance(chunk, dict):
                                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"engine /v1/chat/completions failed: {exc!r}") from exc
        return 200, chunks

    async def _get(self, path: str, purpose: Purpose) -> httpx.Response:
        response = await self.request("GET", path, purpose=purpose)
        if response.status_code != 200:
            raise UpstreamError(f"engine {path} answered {response.status_code}")
        return response

    async def _send(self, body: dict[str, Any], request_id: str, expired: calls.Expired) -> httpx.Response:
        # orjson writes the same bytes as httpx's json= (compact, UTF-8): the body carries the keyframe's ~160
        # KiB of base64, which the standard encoder scans character by character, msgspec's at 48 µs, orjson's
        # (SIMD) at 5.
        headers = self._chat_headers.copy()
        headers["X-Request-Id"] = request_id
        request = httpx.Request(
            "POST",
            self._chat_url,
            content=orjson.dumps(body),
            headers=headers,
            extensions={
                "timeout": self._chat_timeout,
                calls.EXPIRED_KEY: expired,  # a cancellation past our deadline is counted a timeout
            },
        )
        stream = bool(body.get("stream"))
        # The first attempt outside stamina's retry context (its set-up costs every call; a retry is rare):
        # a connect failure then enters the context, which replays that failure as its own first attempt,
        # so the attempts, the back-off before each retry and stamina's testing mode are as they were.
        try:
            return await self._exchange(request, stream=stream)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            if self.connect_retries <= 0:
                raise
            first_failure: BaseException | None = exc
        # Retry only what the engine never saw: a refused or timed-out connection.
        async for attempt in stamina.retry_context(
            on=(httpx.ConnectError, httpx.ConnectTimeout),
            attempts=self.connect_retries + 1,
            wait_initial=0.05,
            wait_max=1.0,
            wait_jitter=0.1,
        ):
            with attempt:
                if first_failure is not None:
                    failure, first_failure = first_failure, None
                    raise failure
                return await self._exchange(request, stream=stream)
        raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover - for mypy

    async def _exchange(self, request: httpx.Request, *, stream: bool) -> httpx.Response:
        """``AsyncClient.send`` for the verdict call, straight to the (counted) transport.

        The client's own layers (authentication, redirects, the cookie jar, event hooks, the elapsed-time
        wrapper, the request rebuilt under ``base_url``) do nothing for an engine call, and were a tenth of
        the event loop's time per moderation at eight clients (bench/overhead.py under py-spy)."""
        response = await self._counted.handle_async_request(request)
        response.request = request
        if not stream:
            try:
                await response.aread()
            except BaseException:
                await response.aclose()
                raise
        return response

    async def chat(self, body: dict[str, Any], request_id: str) -> EngineAnswer:
        """One chat completion (streamed if the body asks); refused at once while the circuit is open."""
        body = (await self.wire()).chat_body(body)
        try:
            if self.circuit is None:
                return await self._chat(body, request_id)
            async with self.circuit.call(engine_failed):
                return await self._chat(body, request_id)
        except CircuitOpen:
            self._refused("verdict")
            raise
        except ServerSideError as exc:
            if engine_failed(exc):
                self._props_read_at = None  # it may be restarting, with other slots: read /props next call
            raise

    async def _chat(self, body: dict[str, Any], request_id: str) -> EngineAnswer:
        started = time.monotonic()
        state = _StreamState()
        try:
            async with asyncio.timeout(self.total_timeout_s) as whole:
                try:
                    # Connecting (with its retries) and the engine's response headers count against the
                    # first-token deadline too: a hung engine is found out at that deadline, not the total.
                    async with asyncio.timeout(self.first_token_timeout_s) as first:
                        def expired() -> bool:
                            return whole.expired() or first.expired()
                        response = await self._send(body, request_id, expired)
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    raise EngineUnavailable(
                        f"cannot connect to the engine at {self.base_url}: {exc!r}"
                    ) from exc
                except TimeoutError as exc:
                    raise UpstreamTimeout(
                        f"no answer from the engine within the first-token deadline"
                        f" ({self.first_token_timeout_s:g} s)"
                    ) from exc
                try:
                    # the call counted as what happened to its answer: whole, timed out, cut short, left
                    with calls.settling(response, expired):
                        if response.status_code != 200:
                            await response.aread()
                            wire = self._wire or wire_for(DEFAULT_KIND)
                            raise refusal_error(wire, response.status_code, error_message(response))
                        if body.get("stream"):
                            await self._read_stream(response, state, started)
                        else:
                            await self._read_body(response, state, started)
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            phase = "the first token" if state.first_token_at is None else "the end of the answer"
            raise UpstreamTimeout(f"engine deadline passed waiting for {phase}") from exc
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"engine read timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"engine connection failed mid-answer: {exc!r}") from exc
        total = time.monotonic() - started
        return EngineAnswer(
            content="".join(state.content) if state.content else None,
            reasoning="".join(state.reasoning) if state.reasoning else None,
            finish_reason=state.finish_reason,
            usage=Usage.from_wire(state.usage, (self._wire or wire_for(DEFAULT_KIND)).counts_image_tokens),
            ttft_s=None if state.first_token_at is None else state.first_token_at - started,
            total_s=total,
            request_id=request_id,
            streamed=bool(body.get("stream")),
            logprobs=None if state.logprobs is None else tuple(state.logprobs),
            logprobs_grammar_masked=(self._wire or wire_for(DEFAULT_KIND)).logprobs_grammar_masked,
            engine=self.base_url,
        )

    async def _read_body(self, response: httpx.Response, state: _StreamState, started: float) -> None:
        raw = await response.aread()
        try:
            payload = engine_json(raw)
            choice = payload["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(f"engine answered a malformed completion: {exc!r}") from exc
        state.first_token_at = time.monotonic()  # not streamed: the whole answer is the first token
        if message.get("content"):
            state.content.append(message["content"])
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if reasoning:
            state.reasoning.append(reasoning)
        state.finish_reason = choice.get("finish_reason")
        state.logprobs = logprob_entries(choice)
        state.usage = payload.get("usage")
        state.done = True

    async def _read_stream(self, response: httpx.Response, state: _StreamState, started: float) -> None:
        lines = sse_lines(response.aiter_bytes())
        first_chunk_is_a_token = (self._wire or wire_for(DEFAULT_KIND)).first_chunk_is_a_token
        # one deadline over the lines before the first token, lifted once it came (not a timer per line)
        first_token = asyncio.timeout_at(self._loop_time(started + self.first_token_timeout_s))
        try:
            async with first_token:
                async for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        state.done = True
                        break
                    try:
                        chunk = engine_json(data)
                    except ValueError as exc:
                        shown = data[:80].decode(errors="replace")
                        raise UpstreamError(f"engine sent a malformed stream chunk: {shown!r}") from exc
                    self._read_chunk(chunk, state, first_chunk_is_a_token)
                    if state.first_token_at is not None and first_token.when() is not None:
                        first_token.reschedule(None)
        except TimeoutError as exc:
            if not first_token.expired():
                raise  # the total deadline's, outside
            raise UpstreamTimeout(
                f"no first token from the engine within {self.first_token_timeout_s:g} s"
            ) from exc
        if state.done:
            # Read past [DONE] to the end of the body (the chunked terminator follows it): a response closed
            # unread is a connection closed, and the pool would open a new one for every engine request.
            with contextlib.suppress(TimeoutError, httpx.HTTPError):
                async with asyncio.timeout(1.0):
                    async for _ in lines:
                        pass
        if not state.done or state.finish_reason is None:
            raise UpstreamError("the engine's stream ended before the answer was complete")

    @staticmethod
    def _loop_time(monotonic_at: float) -> float:
        """A ``time.monotonic()`` instant on the running loop's clock (what ``asyncio.timeout_at`` takes)."""
        return asyncio.get_running_loop().time() + (monotonic_at - time.monotonic())

    @staticmethod
    def _read_chunk(chunk: Any, state: _StreamState, first_chunk_is_a_token: bool) -> None:
        """One stream chunk into ``state``."""
        if not isinstance(chunk, dict):
            raise UpstreamError(f"engine sent a stream chunk that is not an object: {str(chunk)[:80]!r}")
        if chunk.get("usage"):
            state.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                state.reasoning.append(reasoning)
            if delta.get("content"):
                state.content.append(delta["content"])
            entries = logprob_entries(choice)
            if entries is not None:
                state.logprobs = state.logprobs or []
                state.logprobs.extend(entries)
            token = reasoning or delta.get("content") or (first_chunk_is_a_token and "role" in delta)
            if token and state.first_token_at is None:
                state.first_token_at = time.monotonic()
            if choice.get("finish_reason"):
                state.finish_reason = choice["finish_reason"]
