"""`check_deploy`: read the inputs, run every rule, and sort the findings into one report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from deploy.check.compose import default_env_file, read_deployment
from deploy.check.compose_config import run_compose_config
from deploy.check.loader import load_document, read_dotenv
from deploy.check.model import CheckReport, Finding, Location, UnreadableInputError
from deploy.check.rules import run_rules


def check_deploy(
    compose_files: Sequence[Path],
    *,
    env_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    compose_config: bool = True,
) -> CheckReport:
    """Run every rule over the compose files (merged in order, like `docker compose -f a -f b`).

    `env_file` defaults to `.env` beside the first compose file, else `.env.example` there (with a
    warning). `environ` is the shell environment that overrides `.env` (pass `os.environ`).
    Raises UnreadableInputError when an input cannot be read or parsed.
    """
    if not compose_files:
        raise UnreadableInputError("no compose file given")
    documents = [load_document(path) for path in compose_files]
    findings: list[Finding] = []
    if env_file is None:
        env_file = default_env_file(compose_files[0].parent, compose_files[0].name)
        if env_file is not None and env_file.name.endswith(".example"):
            meant = env_file.name.removesuffix(".example")
            findings.append(
                Finding(
                    "warning",
                    "env-file",
                    f"no {meant} beside {compose_files[0].name}: variables resolved from {env_file.name} "
                    f"(cp {env_file.name} {meant} before starting)",
                    Location(env_file),
                )
            )
    elif not env_file.is_file():
        raise UnreadableInputError(f"{env_file}: no such file")
    environment = dict(environ or {})
    dotenv = read_dotenv(env_file, environment, findings) if env_file is not None else None
    deployment = read_deployment(documents, dotenv, environment)
    findings += run_rules(deployment)
    findings += deployment.problems
    status = "skipped: --skip-compose-config"
    if compose_config:
        status, config_findings = run_compose_config(compose_files, env_file)
        findings += config_findings
    order = {path: index for index, path in enumerate([*compose_files, *([env_file] if env_file else [])])}
    findings.sort(key=lambda f: (order.get(f.location.file, len(order)), f.location.line or 0, f.rule))
    return CheckReport(tuple(compose_files), env_file, tuple(findings), status)
