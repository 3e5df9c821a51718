"""How the figure check (tests/figures.py) reads the front page and the results READMEs of an earlier commit,
against today's files: each old page is put beside today's for the check, then removed.

    python3 bench/doc_figures_at.py 1d41a72 > bench/results/doc_figures-1d41a72.txt
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import figures  # noqa: E402


def main(rev: str) -> None:
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "--", "README.md", "docs/results"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout.split()
    pages = [n for n in names if n == "README.md" or (n.startswith("docs/results/") and n.endswith("/README.md"))]
    allow = figures.load_allow()
    total = 0
    print(f"figure check of the pages at {rev} against the files of the working tree")
    for name in pages:
        old = subprocess.run(
            ["git", "show", f"{rev}:{name}"], capture_output=True, text=True, check=True, cwd=REPO
        ).stdout
        target = REPO / name
        if not target.parent.is_dir():
            continue
        page = target.parent / ".old-page-check.md"
        try:
            page.write_text(old)
            problems = figures.check(page, allow)
        finally:
            page.unlink(missing_ok=True)
        total += len(problems)
        print(f"\n{name}: {len(problems)} problem(s)")
        for p in problems:  # the page's own words are left out: the line number finds them in the old page
            print("  " + p.replace(".old-page-check.md", "README.md").split(" and no file cited: ")[0]
                  + (" and no file cited" if " and no file cited: " in p else ""))
    print(f"\n{total} problem(s) in {len(pages)} page(s)")


if __name__ == "__main__":
    main(sys.argv[1])
