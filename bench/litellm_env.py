"""LiteLLM's proxy as a peer gateway for the overhead benchmark, in a virtual environment of its own.

LiteLLM pins its own web stack (FastAPI, its own httpx/aiohttp, pydantic), so it never shares modgate's
environment: ``${MODGATE_BENCH_HOME:-~/.cache/modgate}/litellm-venv`` is created once with
``pip install 'litellm[proxy]==LITELLM_VERSION'``, then reused. The proxy is configured with one model, an
OpenAI-compatible backend (``openai/<model>`` at the engine's ``/v1``), no database, no callbacks, no
network at start (the model cost map is read from the package, not fetched).

    python -m bench.litellm_env            # create or check the environment; print its litellm path
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path

import yaml

from bench.servers import free_port, stop, wait_until_ready
from deploy.engine_launch import exclusive_lock

# The newest release whose ``[proxy]`` extra resolves from PyPI on Python 3.11: 1.108.x and later pin
# litellm-proxy / litellm-proxy-extras / litellm-enterprise releases that PyPI does not have, and 1.107.0 was
# a compromised release (withdrawn).
LITELLM_VERSION = "1.106.12"
SERVED_NAME = "modgate-bench"  # the model name callers send to the proxy


def bench_home() -> Path:
    """Where benchmark environments live: ``$MODGATE_BENCH_HOME`` or ``~/.cache/modgate``."""
    return Path(os.environ.get("MODGATE_BENCH_HOME") or Path.home() / ".cache" / "modgate")


def venv_dir() -> Path:
    """The LiteLLM virtual environment."""
    return bench_home() / "litellm-venv"


def ensure_litellm(version: str = LITELLM_VERSION) -> Path:
    """The ``litellm`` executable of the pinned version, installing it first if needed."""
    root = venv_dir()
    executable = root / "bin" / "litellm"
    marker = root / "modgate-litellm-version"
    # One installer at a time: the suite installs it in the background (scripts/test) while a test may ask.
    with exclusive_lock(root.with_name("litellm-venv.lock")):
        if executable.exists() and marker.exists() and marker.read_text().strip() == version:
            return executable
        print(f"installing litellm[proxy]=={version} into {root} (once; a few minutes)", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        subprocess.run(
            [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", f"litellm[proxy]=={version}"],
            check=True,
        )
        marker.write_text(version)
    return executable


def proxy_config(engine_url: str, model: str, master_key: str) -> dict[str, object]:
    """One model on an OpenAI-compatible backend; nothing on that costs per request beyond the proxying.

    A master key is required (LiteLLM refuses to start without one); callers send it as their bearer key,
    as modgate's callers send theirs.
    """
    return {
        "model_list": [
            {
                "model_name": SERVED_NAME,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": f"{engine_url}/v1",
                    "api_key": "none",  # the OpenAI client insists on a key; the engine ignores it
                },
            }
        ],
        "litellm_settings": {
            "drop_params": False,  # vLLM's own fields (chat_template_kwargs, ...) go through unchanged
            "set_verbose": False,
            "request_timeout": 60,
        },
        "general_settings": {"master_key": master_key, "disable_spend_logs": True},
    }


def proxy_environment() -> dict[str, str]:
    """Environment for the proxy: no network at start, no telemetry, quiet logs."""
    return {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
        "NO_DOCS": "True",
    }


@contextlib.contextmanager
def litellm_proxy(engine_url: str, model: str, master_key: str, workers: int = 1) -> Iterator[str]:
    """LiteLLM's proxy in a process of its own, in front of ``engine_url``; yields its URL."""
    executable = ensure_litellm()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="modgate-litellm-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(yaml.safe_dump(proxy_config(engine_url, model, master_key)))
        args = [str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        if workers > 1:
            args += ["--num_workers", str(workers)]
        log = (Path(tmp) / "litellm.log").open("wb")
        proc = subprocess.Popen(
            args, env={**os.environ, **proxy_environment()}, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            try:
                wait_until_ready(f"{url}/health/liveliness", proc, timeout_s=600)  # minutes at load 30
            except RuntimeError as exc:
                log.flush()
                tail = (Path(tmp) / "litellm.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{exc}; litellm said:\n{tail}") from exc
            yield url
        finally:
            stop(proc)
            log.close()


def main() -> None:
    """Create (or check) the environment and say where it is."""
    print(ensure_litellm())


if __name__ == "__main__":
    main()
