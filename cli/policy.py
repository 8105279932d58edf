"""``modgate policy show|set|rollback|history|audit``: the thinking policy of a running gateway, over HTTP.

Every command needs the admin token (``--token`` or ``MODGATE_AUTH__ADMIN_TOKEN``), every change a
``--reason``.
``set`` reads the policy in force, applies the options (and/or a JSON or YAML file of fields) and sends it
back with the version it was read at, so a flip made meanwhile by someone else is refused (409), not lost.
"""

from __future__ import annotations

import getpass
import json
import re
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import httpx
import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.gateway_url import DEFAULT_GATEWAY_URL, GatewayUrl, OldUrl, gateway_url
from gateway.policy.rules import MODES, AuditEntry, ThinkingPolicy, policy_changes
from gateway.renamed_settings import env_name, option_envvars, warn_if_read_by_old_name

policy_app = typer.Typer(help="Show and flip the thinking policy of a running gateway (admin token).",
                         no_args_is_help=True)

_SHOWN_ONLY = ("updated_at", "updated_by", "content_hash", "store", "changed", "reason", "version")

ADMIN = env_name("auth", "admin_token")  # MODGATE_AUTH__ADMIN_TOKEN
Token = Annotated[str | None, typer.Option("--token", envvar=option_envvars(ADMIN), show_default=False,
                                           callback=warn_if_read_by_old_name(ADMIN),
                                           help=f"Admin token (default: {ADMIN}).")]
Operator = Annotated[str | None, typer.Option("--as", show_default=False,
                                              help="Your name in the audit trail (default: your login).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the gateway's JSON instead of tables.")]
Reason = Annotated[str, typer.Option("--reason", help="Why: kept in the audit trail (required).")]

class _Yaml12Loader(yaml.SafeLoader):
    """YAML with 1.2 booleans (true/false only): ``default_mode: off`` stays the string "off"."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _console(stderr: bool = False) -> Console:
    # At least 120 columns, so tables stay readable when piped; wider when the terminal is.
    width = max(120, shutil.get_terminal_size((120, 40)).columns)
    # No markup: reasons, names and the gateway's messages are printed as they are, brackets and all.
    return Console(width=width, highlight=False, markup=False, stderr=stderr)


def _fail(message: str, code: int = 1) -> NoReturn:
    _console(stderr=True).print(Text.assemble(("error:", "red"), f" {message}"))
    raise typer.Exit(code)


def _login() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in a bare container: the token's id alone names the caller
        return None


class AdminClient:
    """The gateway's admin API with the token and the operator's name on every call."""

    def __init__(self, url: str, token: str | None, operator: str | None = None) -> None:
        if not token:
            _fail("no admin token: pass --token or set MODGATE_AUTH__ADMIN_TOKEN", code=2)
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"}
        name = operator or _login()
        if name:
            headers["X-Modgate-Operator"] = name
        self._headers = headers

    def call(self, method: Literal["GET", "PUT", "POST"], path: str, body: dict[str, Any] | None = None,
             params: dict[str, int] | None = None) -> dict[str, Any]:
        """One admin call; a refusal is printed with the gateway's own message and ends the command."""
        try:
            response = httpx.request(method, f"{self.url}{path}", json=body, params=params,
                                     headers=self._headers, timeout=10.0)
        except httpx.HTTPError as exc:
            _fail(f"cannot reach the gateway at {self.url}: {exc}")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code >= 400:
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            message = error.get("message") or response.text[:200]
            _fail(f"{response.status_code} {error.get('code') or ''}: {message}".replace("  ", " "))
        if not isinstance(answer, dict):
            _fail(f"the gateway answered {method} {path} with something that is not a JSON object")
        return answer


def _rule_text(rule: dict[str, Any]) -> str:
    """A rule in one line: ``appeals (tag appeal: thinking on, kept under load)``."""
    match = []
    if rule.get("tenants"):
        match.append("tenant " + "|".join(rule["tenants"]))
    if rule.get("tags"):
        match.append("tag " + "|".join(rule["tags"]))
    low, high = rule.get("priority_at_least"), rule.get("priority_at_most")
    if low is not None or high is not None:
        match.append(f"priority {'' if low is None else low}..{'' if high is None else high}")
    effects = []
    if rule.get("mode"):
        effects.append(f"thinking {rule['mode']}")
    if rule.get("allow_caller_choice") is not None:
        effects.append("caller may choose" if rule["allow_caller_choice"] else "caller may not choose")
    if rule.get("keep_under_load"):
        effects.append("kept under load")
    return f"{rule.get('name')} ({' & '.join(match)}: {', '.join(effects)})"


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list) and all(isinstance(item, dict) and "name" in item for item in value):
        return "; ".join(_rule_text(rule) for rule in value) or "none"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _when(value: Any) -> str:
    """An ISO timestamp from the gateway, to the second (UTC)."""
    return "—" if not value else f"{str(value)[:19].replace('T', ' ')} UTC"


def _print_policy(doc: dict[str, Any]) -> None:
    console = _console()
    store = doc.get("store") or {}
    state = Text("available") if store.get("available") else Text.assemble(
        ("UNAVAILABLE", "bold red"), f" ({store.get('detail')}): flips are refused")
    console.print(Text.assemble("thinking policy ", (f"version {doc['version']}", "bold"),
                                f"  hash {doc['content_hash']}  store {store.get('backend')} ", state))
    console.print(f"changed {_when(doc.get('updated_at'))} by {doc.get('updated_by') or '—'}: "
                  f"{doc.get('reason') or '—'}")
    table = Table("setting", "value", show_header=False, box=None, pad_edge=False)
    for name in ("default_mode", "allow_caller_choice", "max_completion_tokens_on",
                 "max_completion_tokens_off", "thinking_token_budget", "shadow_share"):
        table.add_row(name, _cell(doc.get(name)))
    load = doc.get("load") or {}
    if load.get("enabled"):
        marks = []
        if load.get("queue_depth_high") is not None:
            marks.append(f"queue depth off above {load['queue_depth_high']}, "
                         f"on below {load['queue_depth_low']}")
        if load.get("queue_wait_ms_high") is not None:
            marks.append(f"mean queue wait off above {load['queue_wait_ms_high']} ms, on below "
                         f"{load['queue_wait_ms_low']} ms over {load['window_s']} s")
        table.add_row("load rule", "; ".join(marks))
    else:
        table.add_row("load rule", "off")
    escalation = doc.get("escalation") or {}
    if escalation:
        caps = [f"{escalation['max_share']:.0%} of frames" if escalation.get("max_share") else "",
                f"{escalation['max_per_minute']:g}/min" if escalation.get("max_per_minute") else ""]
        table.add_row("escalation", (
            f"re-ask below confidence {escalation.get('threshold')}, and review, and "
            f"{', '.join(escalation.get('always_categories') or []) or 'no category'}; cap per replica "
            f"{' and '.join(c for c in caps if c) or 'none'} ({escalation.get('cap_applies')})"))
    console.print(table)
    rules = doc.get("rules") or []
    if rules:
        ruled = Table("rule", "tenants", "tags", "priority", "mode", "caller choice", "under load",
                      title="rules (first match applies)", title_justify="left")
        for rule in rules:
            low, high = rule.get("priority_at_least"), rule.get("priority_at_most")
            priority = "any" if low is None and high is None else f"{_cell(low)}..{_cell(high)}"
            ruled.add_row(rule["name"], ", ".join(rule.get("tenants") or []) or "any",
                          ", ".join(rule.get("tags") or []) or "any", priority, rule.get("mode") or "default",
                          _cell(rule.get("allow_caller_choice")),
                          "keep" if rule.get("keep_under_load") else "off")
        console.print(ruled)


def _print_changes(changes: dict[str, dict[str, Any]]) -> None:
    table = Table("field", "old", "new")
    for field, change in changes.items():
        table.add_row(field, _cell(change["old"]), _cell(change["new"]))
    _console().print(table)


def _document(doc: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in doc.items() if key not in _SHOWN_ONLY}


def _read_fields(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc}", code=2)
    is_yaml = path.suffix in (".yaml", ".yml")
    try:
        # _Yaml12Loader builds plain values only, like yaml.safe_load.
        fields = yaml.load(text, Loader=_Yaml12Loader) if is_yaml else json.loads(text)  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        _fail(f"{path} is not valid {'YAML' if is_yaml else 'JSON'}: {exc}", code=2)
    if not isinstance(fields, dict):
        _fail(f"{path} must hold an object of policy fields", code=2)
    return fields


def _parse(fields: dict[str, Any], what: str) -> ThinkingPolicy:
    try:
        return ThinkingPolicy.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "policy"
        _fail(f"{what}: {where}: {first['msg']}", code=2)


@policy_app.command()
def show(
    url: GatewayUrl = DEFAULT_GATEWAY_URL, token: Token = None, as_json: AsJson = False,
    old_url: OldUrl = None,
) -> None:
    """The policy in force on the gateway, its hash and whether flips can be made now."""
    url = gateway_url(url, old_url)
    doc = AdminClient(url, token).call("GET", "/admin/thinking-policy")
    if as_json:
        typer.echo(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        _print_policy(doc)


@policy_app.command("set")
def set_policy(
    reason: Reason,
    default_mode: Annotated[str | None, typer.Option(
        help="on, off or escalate: the mode no rule decides.")] = None,
    caller_choice: Annotated[bool | None, typer.Option(
        "--caller-choice/--no-caller-choice", help="Whether callers may ask for a mode.")] = None,
    max_tokens_on: Annotated[int | None, typer.Option(help="Output cap with thinking on.")] = None,
    max_tokens_off: Annotated[int | None, typer.Option(help="Output cap with thinking off.")] = None,
    thinking_budget: Annotated[int | None, typer.Option(
        help="Reasoning token budget sent to the engine (0: none).")] = None,
    shadow_share: Annotated[float | None, typer.Option(
        help="Share of frames re-judged in the other mode.")] = None,
    load_rule: Annotated[bool | None, typer.Option(
        "--load-rule/--no-load-rule", help="Switch the load rule on or off (its marks from the document).")
    ] = None,
    escalation_threshold: Annotated[float | None, typer.Option(
        help="escalate: re-ask with thinking on below this fast-verdict confidence.")] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help="JSON or YAML object of policy fields, applied over the policy in force.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change; change nothing.")
                       ] = False,
    url: GatewayUrl = DEFAULT_GATEWAY_URL,
    old_url: OldUrl = None,
    token: Token = None,
    operator: Operator = None,
) -> None:
    """Change the policy: the options and/or a file, applied over the policy in force, with a reason."""
    url = gateway_url(url, old_url)
    if default_mode is not None and default_mode not in MODES:
        _fail("--default-mode must be on, off or escalate", code=2)
    client = AdminClient(url, token, operator)
    current_doc = client.call("GET", "/admin/thinking-policy")
    fields = _document(current_doc)
    if file is not None:
        fields.update(_document(_read_fields(file)))
    options: dict[str, Any] = {
        "default_mode": default_mode, "allow_caller_choice": caller_choice,
        "max_completion_tokens_on": max_tokens_on, "max_completion_tokens_off": max_tokens_off,
        "shadow_share": shadow_share,
    }
    fields.update({name: value for name, value in options.items() if value is not None})
    if thinking_budget is not None:
        fields["thinking_token_budget"] = thinking_budget or None
    if load_rule is not None:
        fields["load"] = {**(fields.get("load") or {}), "enabled": load_rule}
    if escalation_threshold is not None:
        fields["escalation"] = {**(fields.get("escalation") or {}), "threshold": escalation_threshold}
    if file is None and all(value is None for value in (*options.values(), thinking_budget, load_rule,
                                                        escalation_threshold)):
        _fail("nothing to set: give an option (see --help) or --file", code=2)
    current = _parse(_document(current_doc), "the gateway's policy")
    proposed = _parse(fields, "the new policy")
    changes = policy_changes(current, proposed)
    console = _console()
    if not changes:
        console.print(f"no change: version {current_doc['version']} already decides this")
        return
    if dry_run:
        console.print(f"dry run: these changes to version {current_doc['version']} would be made")
        _print_changes(changes)
        return
    answer = client.call("PUT", "/admin/thinking-policy",
                         {**fields, "version": current_doc["version"], "reason": reason})
    if not answer.get("changed"):
        console.print(f"no change: version {answer['version']} already decides this")
        return
    console.print(f"thinking policy version {current_doc['version']} → {answer['version']} "
                  f"(hash {answer['content_hash']})")
    _print_changes(changes)


@policy_app.command()
def rollback(
    reason: Reason,
    to: Annotated[int | None, typer.Option(
        "--to", help="Version whose content to restore (default: the previous).")] = None,
    url: GatewayUrl = DEFAULT_GATEWAY_URL,
    old_url: OldUrl = None,
    token: Token = None,
    operator: Operator = None,
) -> None:
    """Restore an earlier version's content, as a new version (versions only go up)."""
    url = gateway_url(url, old_url)
    client = AdminClient(url, token, operator)
    before = client.call("GET", "/admin/thinking-policy")
    answer = client.call("POST", "/admin/thinking-policy/rollback", {"to_version": to, "reason": reason})
    console = _console()
    if not answer.get("changed"):
        console.print(f"no change: version {answer['version']} already decides like "
                      f"version {to or int(before['version']) - 1}")
        return
    console.print(f"thinking policy version {before['version']} → {answer['version']} "
                  f"(content of version {to or int(before['version']) - 1}, hash {answer['content_hash']})")
    _print_changes(policy_changes(_parse(_document(before), "before"), _parse(_document(answer), "after")))


def _listed(path: str, limit: int, url: str, token: str | None, as_json: bool) -> list[dict[str, Any]] | None:
    """An admin listing's newest ``limit`` rows; printed as JSON (and None) with ``--json``."""
    rows: list[dict[str, Any]] = AdminClient(url, token).call("GET", path, params={"limit": limit})["data"]
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return None
    return rows


def _table(fixed: tuple[str, ...], growing: dict[str, int]) -> Table:
    """A full-width table: the ``fixed`` columns never wrap; the ``growing`` ones share the rest by ratio."""
    table = Table(*fixed, *growing, expand=True)
    for column in table.columns[:len(fixed)]:
        column.no_wrap = True
    for column, ratio in zip(table.columns[len(fixed):], growing.values(), strict=True):
        column.ratio = ratio
    return table


@policy_app.command()
def history(
    limit: Annotated[int, typer.Option(help="How many versions.")] = 20,
    url: GatewayUrl = DEFAULT_GATEWAY_URL,
    old_url: OldUrl = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Earlier versions of the policy, newest first."""
    rows = _listed("/admin/thinking-policy/history", limit, gateway_url(url, old_url), token, as_json)
    if rows is None:
        return
    fixed = ("version", "changed at (UTC)", "by", "default", "rules", "load rule", "hash")
    table = _table(fixed, {"reason": 1})
    for doc in rows:
        load_rule = "on" if (doc.get("load") or {}).get("enabled") else "off"
        rules = str(len(doc.get("rules") or []))
        changed_at = _when(doc.get("updated_at")).removesuffix(" UTC")
        by = _cell(doc.get("updated_by")).split(" (admin:")[0]  # the audit trail has the token's id too
        table.add_row(str(doc["version"]), changed_at, by, doc["default_mode"],
                      rules, load_rule, doc["content_hash"], _cell(doc.get("reason")))
    _console().print(table)


@policy_app.command()
def audit(
    limit: Annotated[int, typer.Option(help="How many entries.")] = 20,
    url: GatewayUrl = DEFAULT_GATEWAY_URL,
    old_url: OldUrl = None,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Who changed the policy, when, why, and what changed; newest first."""
    rows = _listed("/admin/audit", limit, gateway_url(url, old_url), token, as_json)
    if rows is None:
        return
    table = _table(("at (UTC)", "who", "action", "version"), {"reason": 1, "changes": 2})
    for raw in rows:
        entry = AuditEntry.model_validate(raw)
        versions = f"{_cell(entry.old_version)} → {entry.new_version}"
        changes = "\n".join(f"{field}: {_cell(change['old'])} → {_cell(change['new'])}"
                             for field, change in entry.changes.items())
        table.add_row(entry.at.strftime("%Y-%m-%d %H:%M:%S"), entry.actor, entry.action, versions,
                      entry.reason, changes or "—")
    _console().print(table)
