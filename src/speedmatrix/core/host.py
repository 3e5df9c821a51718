"""The machine a result was measured on and the code that measured it: the CPU's model and count, and the git
commit of the checkout the package runs from (None for an installed copy). Read once a process."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # src/speedmatrix/core -> the checkout (or site-packages)


@functools.cache
def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo; elsewhere what ``platform`` says, or None)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


@functools.cache
def commit() -> str | None:
    """The commit of the checkout this package runs from, with "-dirty" when tracked files changed; None when it is
    not a git checkout (an installed wheel) or git is absent."""
    if not (PACKAGE_ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(PACKAGE_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(PACKAGE_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def facts() -> dict:
    """What a result's provenance says of the machine and the code (``gpu`` facts come from the measure layer)."""
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "speedmatrix_commit": commit()}
