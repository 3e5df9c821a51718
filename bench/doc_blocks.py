"""Write the generated blocks of a page: a results README's from the files of its folder, docs/metrics.md's from
the declarations in the package.

A README marks a block with the command that made it and the file it reads:

    <!-- generated: speculation matrix.parquet -->
    ...(written by this script)...
    <!-- end generated -->

and this script writes what is between the markers with the same code the report uses, so the figures there are
the file's and change only when the file does. ``--check`` writes nothing and exits 1 when a block differs from
what its file gives (tests/test_doc_figures.py runs it on every README that has a block).

    python3 bench/doc_blocks.py docs/results/tiny-cpu-trained/README.md          # rewrite the blocks
    python3 bench/doc_blocks.py --check docs/results/*/README.md                  # or say which differ
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from speedmatrix.core.table import markdown
from speedmatrix.report import sections

BLOCK = re.compile(r"(<!-- generated: (?P<kind>\w+) (?P<file>\S+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def speculation(path: Path) -> str:
    """Per speculative config, its output tok/s against the same decode cells without speculation (median and
    range) and its acceptance: the report's "Each speculative config" table, from a matrix."""
    # one thread: Arrow's reading threads can abort a short script's exit ("terminate called without an active
    # exception", apache/arrow#34314; 1 exit in 60 here with threads, none in 60 without)
    table = sections.speculation_pays_table(pd.read_parquet(path, use_threads=False))
    return markdown([table]).strip() + "\n" if table else "No speculative config in this matrix.\n"


def kind_columns(_: Path) -> str:
    """docs/metrics.md's rows of the workload kinds' own columns, from each kind's declaration (``matrix_columns``):
    a new kind's columns are documented by its module."""
    from speedmatrix import workloads

    rows = ["| Column | Unit | From the cell JSON | `vllm bench serve` key | What it is |", "|---|---|---|---|---|"]
    for name in workloads.names():
        for c in workloads.get(name).matrix_columns:
            rows.append(f"| {c.name} | {c.unit} | {c.source} | {c.vllm_key} | {c.meaning} |")
    return "\n".join(rows) + "\n"


KINDS = {"speculation": speculation, "kind_columns": kind_columns}


def render(readme: Path) -> str:
    text = readme.read_text()

    def one(m: re.Match) -> str:
        kind, name = m.group("kind"), m.group("file")
        if kind not in KINDS:
            raise SystemExit(f"{readme}: generated block of unknown kind {kind!r} (known: {', '.join(KINDS)})")
        return m.group(1) + KINDS[kind](readme.parent / name) + m.group(5)

    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("readmes", nargs="+", type=Path)
    ap.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a block is not what its file gives"
    )
    args = ap.parse_args(argv)
    stale = []
    for readme in args.readmes:
        new = render(readme)
        if new != readme.read_text():
            stale.append(readme)
            if not args.check:
                readme.write_text(new)
    if args.check and stale:
        print(
            "generated blocks that differ from their files (run python3 bench/doc_blocks.py on them):", file=sys.stderr
        )
        for r in stale:
            print(f"  {r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
