"""The gateway image (deploy/Dockerfile) and the lean install it is made of.

No image registry or Docker daemon is reachable here, so the Dockerfile is linted with hadolint and its
install (the build context its .dockerignore admits, the same pip commands) and its entrypoint are run in a
clean virtualenv: what the image installs and starts is what this test installs and starts.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.servers import free_port
from deploy.keyframes import make_keyframe
from tests.processes import poll

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# The quality extra's packages, by import name: the runtime install must leave every one of them out.
QUALITY_MODULES = ("scipy", "sklearn", "statsmodels", "matplotlib", "duckdb", "threadpoolctl")


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's (INSTRUCTION, arguments), continuation lines joined, comments left out."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def runtime_stage() -> list[tuple[str, str]]:
    """The instructions of the last stage: what the image runs."""
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def build_context(destination: Path) -> Path:
    """Copy what Dockerfile.dockerignore admits from the repository root (``*`` then ``!path`` lines)."""
    rules = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    admitted = [rule[1:] for rule in rules if rule.startswith("!")]
    excluded = [rule for rule in rules if rule and not rule.startswith(("#", "!", "*"))]

    def ignore(directory: str, names: list[str]) -> set[str]:
        relative = Path(directory).relative_to(ROOT)
        return {
            name for name in names
            if name in ("__pycache__", ".mypy_cache") or name.endswith(".pyc")
            or any(fnmatch.fnmatch(str(relative / name), pattern) for pattern in excluded)
        }

    destination.mkdir(parents=True)
    for name in admitted:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=ignore)
        elif source.is_file():
            shutil.copy2(source, destination / name)
    return destination


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_runs_as_a_non_root_user_with_a_health_check_and_the_runtime_install_only() -> None:
    stage = runtime_stage()
    keywords = [keyword for keyword, _ in stage]
    user = next(arguments for keyword, arguments in stage if keyword == "USER")
    assert user not in ("root", "0"), "the gateway must not run as root"
    assert "HEALTHCHECK" in keywords
    installs = [arguments for keyword, arguments in stage if keyword == "RUN" and "pip install" in arguments]
    assert installs, "the runtime stage installs modgate"
    said = [arguments.split("pip install", 1)[1].split("&&")[0] for arguments in installs]
    extras = [re.findall(r"\[([^\]]*)\]", command) for command in said]
    named = {extra.strip() for found in extras for group in found for extra in group.split(",")}
    assert named <= {"video", "archive"}, f"extras beyond video and archive: {named}"
    entrypoint = next(arguments for keyword, arguments in stage if keyword == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["modgate"]


def test_compose_and_kubernetes_use_the_image_by_one_name_and_tag() -> None:
    names = set()
    for path in [*(ROOT / "deploy").rglob("*.yaml")]:
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("image:") and "modgate" in stripped:
                names.add(stripped.removeprefix("image:").split("#")[0].strip())
    assert names == {"modgate:0.1.0"}, names
    for compose in ("compose.yaml", "compose.llamacpp.yaml"):
        assert "dockerfile: deploy/Dockerfile" in (ROOT / "deploy" / "spark" / compose).read_text()


@pytest.mark.timeout(1800)
def test_a_clean_runtime_install_serves_on_the_simulator_and_names_the_quality_extra(tmp_path: Path) -> None:
    context = build_context(tmp_path / "context")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MODGATE_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # The image's two pip commands (build stage, then runtime stage), word for word but for the paths.
    wheel = next(a for k, a in instructions() if k == "RUN" and a.startswith("pip wheel"))
    install = next(a for k, a in runtime_stage() if k == "RUN" and "pip install" in a)
    install = install[install.index("pip install"):].split("&&")[0]
    wheels = tmp_path / "wheels"
    for pip_command in (wheel, install):
        words = [str(wheels) if word == "/wheels" else word for word in shlex.split(pip_command)]
        words = [str(context) + word[1:] if word == "." or word.startswith(".[") else word for word in words]
        subprocess.run([str(python), "-m", *words], cwd=tmp_path, env=env, check=True, capture_output=True)

    which = f"import importlib.util as u; print([m for m in {QUALITY_MODULES!r} if u.find_spec(m)])"
    present = subprocess.run(
        [str(python), "-c", which],
        env=env, check=True, capture_output=True, text=True, cwd=tmp_path,
    ).stdout.strip()
    assert present == "[]", f"the runtime install brought the quality extra's packages: {present}"

    report = subprocess.run(
        [str(bin_dir / "modgate"), "quality", "report", "--records", str(tmp_path)],
        env={**env, "COLUMNS": "200"}, capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert report.returncode == 2, report.stdout + report.stderr
    assert "pip install 'modgate[quality]'" in report.stdout + report.stderr

    # The entrypoint and its default command, on a free loopback port instead of 0.0.0.0:8080.
    stage = runtime_stage()
    port = str(free_port())
    entrypoint = json.loads(next(a for k, a in stage if k == "ENTRYPOINT"))
    command = [port if word == "8080" else "127.0.0.1" if word == "0.0.0.0" else word  # noqa: S104 - the image's 0.0.0.0 becomes loopback here
               for word in json.loads(next(a for k, a in stage if k == "CMD"))]
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [str(bin_dir / entrypoint[0]), *entrypoint[1:], *command],
        env={**env, "MODGATE_SIMULATOR__TIME_SCALE": "0"}, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        poll(lambda: _ready(base, server), 120, "the runtime install's gateway to be ready")
        healthcheck = json.loads(next(a for k, a in stage if k == "HEALTHCHECK").split("CMD", 1)[1])
        probe = [str(python) if word == "python" else word.replace(":8080", f":{port}")
                 for word in healthcheck]
        assert subprocess.run(probe, env=env, cwd=tmp_path, check=False).returncode == 0
        frame = base64.b64encode(make_keyframe("block:violence", seed=3)).decode()
        response = httpx.post(
            f"{base}/v1/moderations",
            json={"input": [{"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{frame}"}}]},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["results"][0]["modgate"]["action"] in ("allow", "review", "block")
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def _ready(base: str, server: subprocess.Popen[bytes]) -> bool:
    if server.poll() is not None:
        pytest.fail(f"modgate serve exited with {server.returncode}")
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
