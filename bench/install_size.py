"""What `pip install .` weighs: a fresh virtualenv's size on disk and its five largest packages.

Each package is the sum of the files its distribution's RECORD lists (bundled libraries such as
``numpy.libs`` included), counted in disk blocks as ``du`` counts them; the total is the whole virtualenv
(pip and setuptools included, as `python3 -m venv` leaves them).

    python -m bench.install_size                      # a new virtualenv, `pip install .` (a minute or two)
    python -m bench.install_size --venv .venv         # an existing virtualenv, as it is
    python -m bench.install_size --extras video,archive
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024

# Run by the virtualenv's own interpreter: bytes on disk per installed distribution.
_PER_PACKAGE = """
import json, os, importlib.metadata as md
sizes = {}
for dist in md.distributions():
    total = 0
    for file in dist.files or ():
        try:
            total += os.stat(file.locate()).st_blocks * 512
        except OSError:
            pass
    sizes[dist.metadata["Name"]] = total
print(json.dumps(sizes))
"""


def disk_bytes(path: Path) -> int:
    """Bytes on disk under ``path``, as ``du`` counts them (blocks; each hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for item in [path, *path.rglob("*")]:
        stat = item.lstat()
        if (stat.st_dev, stat.st_ino) in seen:
            continue
        seen.add((stat.st_dev, stat.st_ino))
        total += stat.st_blocks * 512
    return total


def package_bytes(venv: Path) -> dict[str, int]:
    """Bytes on disk of each distribution installed in ``venv``."""
    out = subprocess.run([str(venv / "bin" / "python"), "-c", _PER_PACKAGE],
                         check=True, capture_output=True, text=True).stdout
    sizes: dict[str, int] = json.loads(out)
    return sizes


def install(venv: Path, extras: str) -> None:
    """A new virtualenv at ``venv`` with this repository installed (not editable), ``extras`` added."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    target = f"{ROOT}[{extras}]" if extras else str(ROOT)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, target], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"pip install {target} failed:\n{done.stderr[-3000:]}")


@dataclass(frozen=True)
class InstallSize:
    """A virtualenv's size, how many distributions it holds and the five largest, in MiB."""

    total_mib: float
    packages: int
    largest: list[tuple[str, float]]


def measure(venv: Path) -> InstallSize:
    """The virtualenv's size and its five largest distributions."""
    packages = sorted(package_bytes(venv).items(), key=lambda item: item[1], reverse=True)
    return InstallSize(round(disk_bytes(venv) / MIB, 1), len(packages),
                       [(name, round(size / MIB, 1)) for name, size in packages[:5]])


def main(argv: list[str] | None = None) -> InstallSize:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, help="measure this virtualenv instead of a new one")
    parser.add_argument("--extras", default="", help="extras for the new virtualenv (comma-separated)")
    args = parser.parse_args(argv)
    if args.venv is not None:
        result = measure(args.venv)
    else:
        with tempfile.TemporaryDirectory(prefix="modgate-size-") as scratch:
            install(Path(scratch) / "venv", args.extras)
            result = measure(Path(scratch) / "venv")
    label = f"pip install .[{args.extras}]" if args.extras else "pip install ."
    print(f"{label}: {result.total_mib} MiB in all, {result.packages} packages; the five largest:")
    for name, mib in result.largest:
        print(f"  {name:<32} {mib:>7} MiB")
    return result


if __name__ == "__main__":
    main()
