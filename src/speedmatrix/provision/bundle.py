"""An offline bundle: every wheel an install needs, for a host with no package index.

``build`` downloads, on a machine that reaches a package index, the wheels of one *target*'s pinned set (its lock
file) into ``<out>/wheels``, builds a wheel here for any package published only as source (pure Python), and writes
``<out>/constraints.lock`` (the lock less the packages left out because the host has them) and ``<out>/bundle.json``
(the target, the lock's hash, every wheel with its sha256). ``make install WHEELS=<out>`` then installs a clone from
the folder with the index switched off (``--no-index --find-links``). docs/gpu.md, "A GPU host with no package index".
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import atomic
from ..core.atomic import write_json
from ..core.errors import BundleError
from ..core.host import CHECKOUT

# the wheel platforms of a Linux x86_64 host of glibc 2.28 or later (what CUDA builds of vLLM and torch are)
MANYLINUX_X86_64 = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
                    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "any")


@dataclass(frozen=True)
class Target:
    """Whom a bundle is for: the pinned set it carries, and the host's Python and platform (None: this machine's)."""

    lock: str
    python: str | None
    platforms: tuple[str, ...]
    what: str


TARGETS = {
    "cpu": Target("requirements.lock", None, (),
                  "this machine's Python and platform: the embedded default (vLLM for the CPU) and the test tools"),
    "cuda": Target("envs/cuda/requirements.lock", "3.12", MANYLINUX_X86_64,
                   "a Linux x86_64 GPU host with Python 3.12: vLLM for CUDA, its torch, the workflow's packages"),
}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ ;\[]", requirement.strip(), maxsplit=1)[0]).lower()


def pinned(lock: Path) -> list[str]:
    """The lock's requirement lines (comments and blank lines left out)."""
    return [ln.strip() for ln in lock.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _version(line: str) -> str:
    """The pinned version of a lock line ("" where it pins none)."""
    _, _, version = _requirement(line).partition("==")
    return version.split(";", 1)[0].strip()


def _requirement(line: str) -> str:
    """A lock line without its annotation ("numpy==2.3.5  # via pandas")."""
    return line.split(" #", 1)[0].strip()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip(*args: str, log=print) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise BundleError(f"pip {args[0]} failed (exit {run.returncode}):\n{run.stderr.strip()[-3000:]}")


def host_has(freeze: Path) -> dict[str, str]:
    """The packages a host lists in its ``pip list --format=freeze`` (or ``pip freeze``) output: name -> version
    ("" where a line names no version, e.g. ``name @ file:///...``)."""
    if not freeze.is_file():
        raise BundleError(f"{freeze}: no such file (write it on the host with `python3 -m pip list --format=freeze`)")
    found = {}
    for line in freeze.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        name, _, version = line.partition("==")
        found[_name(name)] = version.strip() if version else ""
    if not found:
        raise BundleError(f"{freeze}: lists no package (expected `pip list --format=freeze` lines, name==version)")
    return found


def build(target_name: str, out: Path, *, without: tuple[str, ...] = (), also: tuple[str, ...] = (),
          envs: tuple[Path, ...] = (), host: dict[str, str] | None = None, log=print) -> dict:
    """Download the target's wheels into ``out/wheels`` and describe them in ``out/bundle.json``.

    ``without``: packages the host already has (left out of the wheels and of constraints.lock); ``also``:
    requirements added beside the lock (the installer and the build backend, pinned by the caller); ``envs``:
    other environments' lock files, each carried too (their own virtual environments on the host: the
    independent clients', another vLLM release's); ``host``:
    what the host has installed (``host_has``): a package it has at the lock's own version is left out (the
    install uses the host's copy), one it has at another version is carried (both listed in the manifest)."""
    if target_name not in TARGETS:
        raise BundleError(f"unknown bundle target {target_name!r}: choose one of {', '.join(TARGETS)}")
    target = TARGETS[target_name]
    lock = CHECKOUT / target.lock
    if not lock.is_file():
        raise BundleError(f"{lock}: the {target_name} target's lock file is missing")
    host = host or {}
    patterns = [_name(w) for w in without]
    # a package the host has is left out only at the lock's own version: the install is then the lock exactly,
    # the host's copy used where it is the same (another version is carried, and the venv's copy comes first)
    # (one rule for the target's lock and every other environment's: a --without pattern, or the host has that
    # very pin; never because another lock's pin of the same package was left out)
    def host_gives(r: str) -> bool:
        return any(fnmatch.fnmatch(_name(r), p) for p in patterns) or host.get(_name(r)) == _version(r)

    same = {_name(r) for r in pinned(lock) if host.get(_name(r)) == _version(r)}
    left_out = sorted({_name(r) for r in pinned(lock) if host_gives(r)})
    kept = [r for r in pinned(lock) if not host_gives(r)]
    # the installer and the build backend go beside the lock, unless the lock pins them itself (vLLM for CUDA pins
    # its setuptools): two pins of one package are a conflict no installer resolves
    locked = {_name(r) for r in pinned(lock)}
    also = tuple(a for a in also if _name(a) not in locked)
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    (out / "constraints.lock").write_text(f"# {target.lock} for the {target_name} bundle"
                                          + (f", less {', '.join(left_out)}" if left_out else "") + "\n"
                                          + "\n".join(kept + list(also)) + "\n")
    platform = [f"--python-version={target.python}", "--implementation=cp", "--only-binary=:all:",
                *(f"--platform={p}" for p in target.platforms)] if target.python else []
    t0 = time.monotonic()
    # the constraints are what the host installs against (the installer and build backend always go); the other
    # environments' pins go by the same rule as the lock's
    for reqs, wanted in ((out / "constraints.lock", lambda r: _name(r) not in left_out),
                         *((e, lambda r: not host_gives(r)) for e in envs)):
        todo = out / f".download-{reqs.stem}.txt"
        todo.write_text("\n".join(_requirement(r) for r in pinned(reqs) if wanted(r)) + "\n")
        try:
            _pip("download", "--no-deps", "--dest", str(wheels), "-r", str(todo), *platform, log=log)
        except BundleError:
            if not platform:
                raise
            # a package published only as source cannot be fetched as a wheel for another platform: fetch
            # everything else, then each source-only one as source, and build it here below (pure Python only)
            _download_one_by_one(todo, wheels, platform, log)
        finally:
            todo.unlink(missing_ok=True)
    _wheels_from_sources(wheels, cross=bool(platform), log=log)
    files = sorted(p for p in wheels.iterdir() if p.is_file())
    manifest = {
        "target": target_name,
        "what": target.what,
        "python": target.python or f"{sys.version_info.major}.{sys.version_info.minor}",
        "platforms": list(target.platforms) or ["this machine's"],
        "engine": target_name,  # `make install ENGINE=...` on the host: the target's vLLM
        "lock": target.lock,
        "lock_sha256": _sha256(lock),
        "left_out": left_out,
        "host_has": sorted(same),
        "host_differs": {_name(r): {"lock": _version(r), "host": host[_name(r)]} for r in pinned(lock)
                         if _name(r) in host and _name(r) not in left_out},
        "also": list(also),
        "envs": [str(p.relative_to(CHECKOUT)) if p.is_relative_to(CHECKOUT) else str(p) for p in envs],
        "wheels": {p.name: _sha256(p) for p in files},
        "bytes": sum(p.stat().st_size for p in files),
        "seconds": round(time.monotonic() - t0, 1),
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(out / "bundle.json", manifest)
    return manifest


def _download_one_by_one(todo: Path, wheels: Path, platform: list[str], log) -> None:
    for req in pinned(todo):
        try:
            _pip("download", "--no-deps", "--dest", str(wheels), req, *platform, log=log)
        except BundleError:
            _pip("download", "--no-deps", "--no-binary=:all:", "--dest", str(wheels), req, log=log)


def _wheels_from_sources(wheels: Path, *, cross: bool, log) -> None:
    """Build a wheel from each source archive in the folder (the host, with no package index, could not). For
    another platform only a pure-Python wheel will do: one built with compiled code would be this machine's."""
    for sdist in sorted([*wheels.glob("*.tar.gz"), *wheels.glob("*.zip")]):
        before = set(wheels.glob("*.whl"))
        _pip("wheel", "--no-deps", "--wheel-dir", str(wheels), str(sdist), log=log)
        sdist.unlink()
        built = set(wheels.glob("*.whl")) - before
        if cross and any(not w.name.endswith("-none-any.whl") for w in built):
            raise BundleError(f"{sdist.name} has no wheel for the target's platform and builds compiled code here: "
                              "build it on a machine of the target's kind and put the wheel in the bundle")


def summary(manifest: dict) -> str:
    mb = manifest["bytes"] / 1e6
    left = f"; left out (the host has them): {', '.join(manifest['left_out'])}" if manifest["left_out"] else ""
    return (f"{len(manifest['wheels'])} wheels, {mb:,.0f} MB, for {manifest['what']} (Python {manifest['python']})"
            f"{left}; made in {manifest['seconds']:.0f} s")


def read(out: Path) -> dict:
    """A bundle's manifest, or an error saying the folder is not one."""
    path = out / "bundle.json"
    if not path.is_file():
        raise BundleError(f"{out}: not a bundle (no bundle.json); make one with `make bundle BUNDLE={out}`")
    return atomic.read_json(path)
