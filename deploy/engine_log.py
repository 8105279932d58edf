"""What a server's log says when it fails: its last lines, and its own error (the root cause)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final


def log_tail(path: Path, lines: int = 60) -> str:
    """The last lines of a log file, or a note that there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


# A Python exception's last line, where vLLM's log prints it: alone, or after a process's prefix and the
# log level ("(EngineCore_DP0 pid=9) ERROR 12-03 10:00:00 [core.py:1100] ValueError: Invalid …").
_EXCEPTION_LINE: Final = re.compile(
    r"(?:^|[\s\]])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$"
)
_NOT_THE_MESSAGE: Final = ("File ", "Traceback", "For further information")
_SEE_ABOVE: Final = "See root cause above"  # vLLM's API server's own exception after its engine core's


def root_cause(log_path: Path) -> str | None:
    """The engine's own error in its log: the last exception line that does not point to another above it
    (vLLM's API server ends with "Engine core initialization failed. See root cause above"), with up to
    three lines that continue its message (pydantic's field and reason)."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for index in range(len(lines) - 1, -1, -1):
        found = _EXCEPTION_LINE.search(lines[index])
        if found is None or _SEE_ABOVE in found.group(2):
            continue
        cause = [f"{found.group(1)}: {found.group(2).strip()}"]
        for line in lines[index + 1 : index + 4]:
            if not line.strip() or line.startswith("(") or line.strip().startswith(_NOT_THE_MESSAGE):
                break  # a log record of its own, a traceback, or pydantic's link
            cause.append(line.strip())
        return " ".join(cause)
    return None
