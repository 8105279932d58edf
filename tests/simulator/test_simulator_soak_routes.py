"""What the soak asks of the simulator: a busy fault answering each engine's own busy 503 (which the gateway
reads as back-pressure), and the in-flight peaks of each interval between reads."""

from __future__ import annotations

import time

import httpx
import pytest

from deploy.simulator import Faults
from gateway.engine.wires import EngineKind, wire_for
from tests.support import SimFactory

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_a_busy_simulator_answers_the_503_its_engine_kind_means_busy_by(
    start_sim: SimFactory, kind: EngineKind
) -> None:
    sim = start_sim(kind=kind, faults=Faults(busy_rate=1.0))
    answer = httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": HI, "max_tokens": 4}, timeout=30)

    assert answer.status_code == 503
    assert wire_for(kind).says_busy(answer.status_code, answer.json()["error"]["message"])


def test_the_busy_fault_is_switched_on_and_off_at_runtime(start_sim: SimFactory) -> None:
    sim = start_sim()
    ask = {"messages": HI, "max_tokens": 4}
    httpx.post(f"{sim.url}/sim/faults", json={"busy_rate": 1.0}, timeout=10).raise_for_status()
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=ask, timeout=30).status_code == 503
    httpx.post(f"{sim.url}/sim/faults", json={}, timeout=10).raise_for_status()
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=ask, timeout=30).status_code == 200


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_the_peaks_read_are_those_since_the_last_read(start_sim: SimFactory, kind: EngineKind) -> None:
    sim = start_sim(kind=kind)
    httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": HI, "max_tokens": 4}, timeout=30)

    first = httpx.post(f"{sim.url}/sim/peaks", timeout=10).json()
    again = httpx.post(f"{sim.url}/sim/peaks", timeout=10).json()

    assert first == {"peak_requests": 1, "peak_running": 1}
    assert again == {"peak_requests": 0, "peak_running": 0}  # nothing ran since the first read


def assert_left_the_engine(url: str) -> None:
    """The one request sent was at the engine (its peak) and is gone from it within 5 s."""
    at_engine = []
    for _ in range(50):
        info = httpx.get(f"{url}/sim/info", timeout=10).json()
        at_engine.append(info["running"] + info["waiting"])
        if at_engine[-1] == 0:
            break
        time.sleep(0.1)
    assert httpx.post(f"{url}/sim/peaks", timeout=10).json()["peak_requests"] == 1  # it was there
    assert at_engine[-1] == 0, at_engine


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_a_caller_hanging_up_on_a_whole_answer_frees_the_engine(
    start_sim: SimFactory, kind: EngineKind
) -> None:
    """As vLLM (``with_cancellation``) and llama-server (``is_connection_closed``) do: a non-streamed request
    whose caller left is dropped from the batch, not run to its last token beside the caller's next request
    (the soak saw 3 requests at a llama-server of 2 slots, the third one a gateway had already given up)."""
    sim = start_sim("spark", time_scale=50.0, kind=kind)  # a verdict takes most of a minute
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": HI, "max_tokens": 64},
                   timeout=httpx.Timeout(30, read=3.0))

    assert_left_the_engine(sim.url)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_a_caller_hanging_up_on_a_stream_frees_the_engine(start_sim: SimFactory, kind: EngineKind) -> None:
    """The same for a streamed answer, closed after its first chunk (a gateway's first-token deadline)."""
    sim = start_sim("spark", time_scale=50.0, kind=kind)
    ask = {"messages": HI, "max_tokens": 64, "stream": True}
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=ask, timeout=30) as answer:
        next(answer.iter_lines())  # the role chunk, sent before the first token

    assert_left_the_engine(sim.url)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_simulator_counts_the_answers_it_sent_whole_and_not_the_cut_ones(
    start_sim: SimFactory, kind: EngineKind, stream: bool
) -> None:
    sim = start_sim(kind=kind)
    ask = {"messages": HI, "max_tokens": 4, "stream": stream}
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json=ask).status_code == 200
        client.post("/sim/faults", json={"cut_stream_rate": 1.0}).raise_for_status()
        client.post("/v1/chat/completions", json={**ask, "max_tokens": 512})  # cut half-way: not whole
        client.post("/sim/faults", json={"busy_rate": 1.0}).raise_for_status()
        assert client.post("/v1/chat/completions", json=ask).status_code == 503

        assert client.get("/sim/info").json()["answers_whole"] == 2
