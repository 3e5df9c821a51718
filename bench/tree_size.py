#!/usr/bin/env python3
"""How heavy the recorded results are that every clone carries: the tracked files under a folder (default
docs/results/) at each commit given, their bytes and count, from git's own tree listing (nothing is checked out).

    python3 bench/tree_size.py 5258394 HEAD [--folder docs/results] [--out bench/results/tree_size.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def size_at(rev: str, folder: str) -> dict:
    listing = subprocess.run(["git", "ls-tree", "-r", "-l", rev, "--", folder], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.splitlines()
    sizes = [int(line.split()[3]) for line in listing if line.split()[1] == "blob"]
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    return {"commit": commit, "folder": folder, "bytes": sum(sizes), "files": len(sizes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("revs", nargs="+")
    ap.add_argument("--folder", default="docs/results")
    ap.add_argument("--out", type=Path)
    ns = ap.parse_args()
    got = [size_at(rev, ns.folder) for rev in ns.revs]
    text = json.dumps(got, indent=1) + "\n"
    if ns.out:
        ns.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
