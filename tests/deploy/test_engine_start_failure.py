"""An engine that exits at start reaches the user through ``modgate engine-cpu`` as its own error, with its
exit status.

The real vLLM refuses an invalid ``--prefix-match-unit`` either while it builds its config (0: pydantic's
``gt=0`` on ``CacheConfig.prefix_match_unit``) or, for a unit that does not divide the hybrid's block, in
``resolve_kv_cache_block_sizes`` after loading the model (about 100 s into a boot): both too dear for the
suite (the first took minutes on a loaded 2-core machine). So a real subprocess writes what the real vLLM
wrote for ``--prefix-match-unit 0`` (fixtures/vllm-invalid-prefix-match-unit.log, its log verbatim) and
exits as it did, and the command's own code path (launch, wait for ``/health``, report) runs on it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deploy.engine_launch import Booted, BootTimings, free_port, launch_server, serve_until_interrupted
from deploy.engine_log import root_cause

REAL_LOG = Path(__file__).parent / "fixtures" / "vllm-invalid-prefix-match-unit.log"
PYDANTIC_CAUSE = (
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig prefix_match_unit "
    "Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]"
)


def _failing_engine(log: Path, code: int) -> list[str]:
    """A server that writes ``log`` as its output and exits ``code`` before it is ever healthy."""
    script = (
        "import sys, time; time.sleep(0.5); "
        f"sys.stdout.write(open({str(log)!r}, encoding='utf-8').read()); sys.exit({code})"
    )
    return [sys.executable, "-c", script]


@pytest.mark.parametrize("code", [1, 3])
def test_an_engine_exiting_at_start_is_reported_with_its_own_error_and_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], code: int
) -> None:
    log = tmp_path / "engine.log"

    def boot() -> Booted:
        url = f"http://127.0.0.1:{free_port()}"
        engine = launch_server(_failing_engine(REAL_LOG, code), {}, log, url, 120.0, "vLLM")
        return engine, BootTimings(())

    status = serve_until_interrupted("engine-cpu", "ready", "the engine", "vLLM", boot)
    assert status == code
    err = capsys.readouterr().err
    first_line = err.splitlines()[0]
    said = f"modgate engine-cpu: vLLM exited with code {code} before it was ready: {PYDANTIC_CAUSE}"
    assert first_line == said
    assert "Input should be greater than 0" in err


def test_the_root_cause_is_the_engine_cores_error_not_the_api_servers_pointer_to_it(tmp_path: Path) -> None:
    # The lines vLLM 0.32 writes when the engine core refuses a unit after loading: its ValueError (as
    # resolve_kv_cache_block_sizes raises it), then the API server's RuntimeError pointing above.
    log = tmp_path / "engine.log"
    log.write_text(
        "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:00 [core.py:1100] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:00 [core.py:1100] Traceback (most recent call last):\n"
        "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:00 [core.py:1100] ValueError: Invalid "
        "prefix_match_unit=100; prefix-cacheable KV cache group block sizes must be divisible by "
        "prefix_match_unit. Got group block sizes=[1152, 1152, 1152, 1152], "
        "prefix-cacheable=[1152, 1152, 1152, 1152].\n"
        "Traceback (most recent call last):\n"
        '  File "entry.py", line 1, in <module>\n'
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
        encoding="utf-8",
    )
    cause = root_cause(log)
    assert cause is not None
    assert cause.startswith("ValueError: Invalid prefix_match_unit=100; prefix-cacheable KV cache group")
    assert cause.endswith("prefix-cacheable=[1152, 1152, 1152, 1152].")
    assert root_cause(REAL_LOG) == PYDANTIC_CAUSE
    assert root_cause(tmp_path / "missing.log") is None
