#!/usr/bin/env python3
"""Does a change of the code change what a finished run says? ``speedmatrix rederive`` of one run's cell files by
two checkouts, and every table and the report compared.

    python3 bench/rederive_same.py OLD_CHECKOUT NEW_CHECKOUT RESULTS [--out bench/results/rederive_same.json]

Each checkout re-derives ``RESULTS`` (a finished run's folder, e.g. ``results/tiny-cpu``) with its own
``.venv/bin/speedmatrix`` and its own ``config/experiments``, into a scratch folder; then matrix.parquet,
decisions.parquet and requests.parquet are compared cell by cell (``pandas.DataFrame.equals`` after sorting the
rows the same way) and report.md line by line. Nothing is measured again.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

TABLES = {"matrix.parquet": ["server_id", "cell_id"], "decisions.parquet": ["server_id", "cell_id", "slo"],
          "requests.parquet": ["server_id", "cell_id", "request_index"]}


def rederive(checkout: Path, results: Path, out: Path) -> None:
    proc = subprocess.run([str(checkout / ".venv/bin/speedmatrix"), "rederive", str(results), "--out", str(out)],
                          cwd=checkout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: rederive failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def compare(old: Path, new: Path, renamed: dict[str, str] | None = None) -> dict:
    """Every table cell for cell (``renamed``: the old side's columns under their new names first, so that a
    renamed column compares its values, not its name), and report.md line by line."""
    out: dict = {}
    for name, keys in TABLES.items():
        a, b = pd.read_parquet(old / name), pd.read_parquet(new / name)
        if renamed and name == "matrix.parquet":
            a = a.rename(columns=renamed)
            a = a[[c for c in b.columns if c in a] + [c for c in a.columns if c not in b]]  # in the new order
            out.setdefault("renamed_in_matrix", renamed)
        if list(a.columns) != list(b.columns):
            out[name] = {"same": False, "columns_only_old": sorted(set(a.columns) - set(b.columns)),
                         "columns_only_new": sorted(set(b.columns) - set(a.columns))}
            continue
        a = a.sort_values(keys, kind="stable").reset_index(drop=True)
        b = b.sort_values(keys, kind="stable").reset_index(drop=True)
        differing = [c for c in a.columns if not a[c].astype(str).equals(b[c].astype(str))]
        out[name] = {"same": bool(a.equals(b)) or not differing, "rows": len(a), "columns": len(a.columns),
                     "columns_that_differ": differing}
    old_md, new_md = (old / "report.md").read_text().splitlines(), (new / "report.md").read_text().splitlines()
    diff = [line for line in difflib.unified_diff(old_md, new_md, "old", "new", lineterm="", n=0)
            if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    out["report.md"] = {"same": not diff, "lines": len(old_md), "changed_lines": diff[:40]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, default=Path("bench/results/rederive_same.json"))
    ap.add_argument("--renamed", action="append", default=[], metavar="OLD=NEW",
                    help="a matrix column the new code names otherwise (docs/metrics.md, \"History\")")
    ns = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rederive-same-"))
    commits = {}
    for side, checkout in (("old", ns.old), ("new", ns.new)):
        rederive(checkout.resolve(), ns.results.resolve(), scratch / side)
        commits[side] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True,
                                       text=True).stdout.strip()
    renamed = dict(r.split("=", 1) for r in ns.renamed)
    got = {"results": str(ns.results), "commits": commits, **compare(scratch / "old", scratch / "new", renamed)}
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(got, indent=2) + "\n")
    print(json.dumps(got, indent=2))
    return 0 if all(v["same"] for k, v in got.items() if isinstance(v, dict) and "same" in v) else 1


if __name__ == "__main__":
    raise SystemExit(main())
