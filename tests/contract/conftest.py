"""The real vLLM CPU engine for contract tests: installed, built and started once per test session.

``real_engine_url`` fails loudly (never skips) when the engine cannot start: a contract suite that
quietly skips its real engine proves nothing. Set ``MODGATE_TEST_ENGINE_URL`` to run against an engine
that is already up (``modgate engine-cpu``) instead of booting one, which saves the ~90 s start locally.

The hybrid model (``--model hybrid``: a tiny Qwen3-Next with Gated DeltaNet layers, text only) is booted
once per session on each engine too: ``real_hybrid_url`` (vLLM, with ``HYBRID_VLLM_ARGS``) and
``real_hybrid_llamacpp_url``; ``MODGATE_TEST_HYBRID_URL`` and ``MODGATE_TEST_HYBRID_LLAMACPP_URL`` name
ones already up.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from deploy.engine_cpu import TINY_HYBRID, boot_engine
from deploy.engine_launch import Booted, EngineError
from deploy.engine_llamacpp import boot_llamacpp

# The first test that asks for the engine pays for the install (minutes on a cold machine) and the
# start (~90 s): give those tests room beyond the suite's default per-test timeout.
ENGINE_TEST_TIMEOUT_S = 1200
# One hybrid vLLM for the session, with a match unit: unprimed requests still get 0 cached tokens on it
# (the seed's failure), and a primer makes the shared prefix hit to the unit, so one boot shows both. No
# compilation (-O0): torch's compile of the hybrid took over 300 s on a loaded 2-core machine.
HYBRID_MATCH_UNIT = 16
HYBRID_VLLM_ARGS = ("--prefix-match-unit", str(HYBRID_MATCH_UNIT), "--optimization-level", "0")
HYBRID_READY_TIMEOUT_S = 1100.0
_HYBRID_FIXTURES = ("real_hybrid_url", "real_hybrid_llamacpp_url")

_boot_report: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give tests that use the real engine the boot budget, unless they set their own timeout."""
    for item in items:
        # The vllm marker too: a test may ask for the engine late, via request.getfixturevalue.
        names = getattr(item, "fixturenames", ())
        asks = any(name in names for name in ("real_engine_url", "real_llamacpp_url", *_HYBRID_FIXTURES))
        marked = item.get_closest_marker("vllm") or item.get_closest_marker("llamacpp")
        if (asks or marked) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_TEST_TIMEOUT_S))


def _session_engine(what: str, variable: str, boot: Callable[[], Booted]) -> Iterator[str]:
    """The engine ``variable`` names when set (already up), else one booted for the session (failing loudly,
    never skipping), its times reported and stopped after."""
    external = os.environ.get(variable)
    if external:
        _boot_report.append(f"real {what}: using {external} ({variable})")
        yield external.rstrip("/")
        return
    try:
        engine, timings = boot()
    except EngineError as exc:
        failure = str(exc)  # failed outside the except block: the log tail once, not twice chained
    else:
        failure = ""
    if failure:
        pytest.fail(f"the real {what} did not start: {failure}", pytrace=False)
    _boot_report.append(
        f"real {what} at {engine.url}: {timings.summary()}, "
        f"RSS {engine.rss_bytes() / 2**20:.0f} MiB, log {engine.log_path}"
    )
    try:
        yield engine.url
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def real_engine_url() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT``) of a real vLLM CPU engine serving the model ``tiny``."""
    yield from _session_engine("vLLM CPU engine", "MODGATE_TEST_ENGINE_URL", boot_engine)


@pytest.fixture(scope="session")
def real_llamacpp_url() -> Iterator[str]:
    """Base URL of the real llama.cpp server (``modgate engine-llamacpp``) serving ``tiny`` with its mmproj.

    Fails (never skips) when it cannot be built or started; ``MODGATE_TEST_LLAMACPP_URL`` names one that
    is already up.
    """
    yield from _session_engine("llama.cpp server", "MODGATE_TEST_LLAMACPP_URL", boot_llamacpp)


@pytest.fixture(scope="session")
def real_hybrid_url() -> Iterator[str]:
    """Base URL of the real vLLM CPU engine serving the tiny hybrid as ``tiny``, with ``HYBRID_VLLM_ARGS``."""
    yield from _session_engine("hybrid vLLM engine", "MODGATE_TEST_HYBRID_URL", lambda: boot_engine(
        model=TINY_HYBRID, extra_args=HYBRID_VLLM_ARGS, ready_timeout=HYBRID_READY_TIMEOUT_S
    ))


@pytest.fixture(scope="session")
def real_hybrid_llamacpp_url() -> Iterator[str]:
    """Base URL of the real llama-server serving the tiny hybrid as GGUF (no projector) as ``tiny``."""
    yield from _session_engine("hybrid llama-server", "MODGATE_TEST_HYBRID_LLAMACPP_URL",
                               lambda: boot_llamacpp(tiny=TINY_HYBRID, vision=False))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Put the engine's install/build/start times in the report, so CI logs show them."""
    if _boot_report:
        terminalreporter.section("real engines (vLLM CPU, llama.cpp)")
        for line in _boot_report:
            terminalreporter.write_line(line)
