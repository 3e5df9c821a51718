"""Every figure of every hand-written page comes from a tracked file (tests/figures.py says how
a figure is looked up); generated blocks are what their files give; each results folder says how it was made; and
the checker fails on the wrong claims it was written to catch."""

import re
import subprocess
import sys

import figures
import pytest

from conftest import REPO

RESULTS = REPO / "docs" / "results"
# pages a program wrote from the files beside it (a run's report, a verdict, what a command printed): their
# figures are the program's reading of those files, checked by making them again (`speedmatrix rederive`,
# bench/rederive_same.py, bench/doc_blocks.py --check), not by this checker
WRITTEN_BY_A_PROGRAM = {"report.md", "report-section.md", "regress.md", "printed.md", "reproduce.md", "compare.md",
                        "pareto.md", "interference.md", "summary.md", "noise-from-another-gpu.md"}
# CI records that transcribe a run's output which was not kept beside them (the records with a .tail.txt are
# checked against it)
TRANSCRIBED = {"docs/results/ci/" + n for n in (
    "2026-12-01.md", "2026-12-01-time-budget.md", "2026-12-02-164de03.md", "2026-12-02-1c35362-de4a53b.md",
    "2026-12-02-1ed2c62.md", "2026-12-02-398d089.md", "2026-12-02-5203946.md", "2026-12-02-6517c5e.md",
    "2026-12-02-74236a7.md", "2026-12-02-968c6aa.md", "2026-12-02-da504ef.md", "2026-12-03-2a025dd.md",
    "2026-12-03-34da4c1.md", "2026-12-03-631ea42.md", "2026-12-03-69dd7f1.md", "2026-12-03-9223c43.md")}

def pages() -> list:
    """Every hand-written page: the front page, every page under docs/ (the decisions, the measurement, fidelity,
    running, gpu and metrics pages, the results READMEs and CI records) and bench's READMEs."""
    found = [REPO / "README.md", REPO / "bench" / "README.md", REPO / "bench" / "results" / "README.md"]
    found += sorted((REPO / "docs").rglob("*.md"))
    return [p for p in found if p.name not in WRITTEN_BY_A_PROGRAM and p.relative_to(REPO).as_posix() not in
            TRANSCRIBED]


def test_what_is_not_checked_is_listed_and_still_there():
    for name in TRANSCRIBED:
        path = REPO / name
        assert path.exists(), f"{name}: gone; take it off TRANSCRIBED"
        assert not path.with_suffix(".tail.txt").exists(), f"{name}: its output is kept now; check it against that"
    written = [p for p in (REPO / "docs").rglob("*.md") if p.name in WRITTEN_BY_A_PROGRAM]
    assert written, "no page a program wrote is left: WRITTEN_BY_A_PROGRAM is stale"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_figure_comes_from_a_file(page):
    problems = figures.check(page, figures.load_allow())
    assert not problems, "figures not found in the files their text cites:\n" + "\n".join(problems)


def test_the_allowlist_is_short_and_each_entry_still_used():
    allow = figures.load_allow()
    entries = allow.get("figures", [])
    assert len(entries) <= 10, "the allowlist is for figures that are not measurements; cite a file instead"
    for e in entries:
        assert e.get("why"), f"{e}: say why it is not a measurement"
        assert e["figure"] in (REPO / e["doc"]).read_text(), f"{e}: no longer on its page; remove the entry"


def test_generated_blocks_are_what_their_files_give():
    with_blocks = [p for p in pages() if "<!-- generated:" in p.read_text()]
    assert with_blocks, "no README has a generated block (bench/doc_blocks.py writes them)"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "doc_blocks.py"), "--check", *map(str, with_blocks)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("readme", sorted(RESULTS.glob("*/README.md")), ids=lambda p: p.parent.name)
def test_each_results_folder_says_how_it_was_made(readme):
    text = readme.read_text()
    commits = re.findall(r"\b[0-9a-f]{7,40}\b", text)
    assert any(re.search(r"\d", c) and re.search(r"[a-f]", c) for c in commits), f"{readme}: name the commit"
    assert re.search(
        r"config/experiments/[\w.-]+\.yaml|experiment\.yaml|\.yaml` files kept here|docs/results/[\w-]+/", text
    ), f"{readme}: name the experiment file"
    assert re.search(
        r"`(?:\.venv/bin/)?(?:make \w+|snakemake|python3? \S+|pytest|speedmatrix \w+)|^    \S*(?:snakemake|"
        r"python3?|make)",
        text,
        re.M,
    ), f"{readme}: give the command"


# The wrong claims, as the pages said them before they were fixed, each with the file its figure comes from. The
# checker must fail on each; the pages say it right today (test_every_figure_comes_from_a_file).
WRONG = [
    (
        "README.md",
        "the install takes about half a minute from a warm package cache and the run about 7½ minutes "
        "([the default's record](docs/results/default/record.json))",
        "not found",
    ),
    (
        "docs/results/open-loop-cpu/README.md",
        "Client-bound (send lag p95 234-325 ms against the 100 ms limit: "
        "`schedule_lag_p95_ms` in `open-loop-cells.csv`)",
        "range",
    ),
    (
        "docs/results/tiny-cpu-trained/README.md",
        "MTP slower than `base` in every decode cell on this CPU (-17.6 % to "
        "-58.9 %); ngram -22 % to +2 % (`total_tok_s` in `matrix.parquet` against `base`'s same cell)",
        "range",
    ),
    (
        "docs/results/h200-tiny-trained-spec/README.md",
        "the GPU's SM utilisation was 2-7 % and its power 124-125 W, "
        "near idle, in every cell (`gpu_sm_util_pct` and `gpu_power_w` in `matrix.parquet`)",
        "range",
    ),
    ("docs/results/open-loop-cpu/README.md", "The whole run took 127 of 127 jobs, 6 min 37 s.", "no file cited"),
]


@pytest.mark.parametrize("where, text, problem", WRONG, ids=[f"{w}:{t[:30]}" for w, t, _ in WRONG])
def test_the_checker_fails_on_the_wrong_claims(tmp_path, where, text, problem):
    page = (REPO / where).parent / f".wrong-claim-{tmp_path.name}.md"  # beside the page: its links resolve there
    try:
        page.write_text(f"# A page\n\n{text}\n")
        found = figures.check(page, figures.load_allow())
    finally:
        page.unlink(missing_ok=True)
    assert any(problem in p for p in found), f"the checker passed a wrong claim: {text!r}\n{found}"


def test_the_results_records_stay_light():
    """Every clone carries docs/results/: under 10 MB, so that a record keeps what its README cites (large tables
    compressed, server logs gzipped, charts nobody cites left out) rather than everything a run wrote."""
    names = subprocess.run(["git", "ls-files", "docs/results"], cwd=REPO, capture_output=True, text=True).stdout
    size = sum((REPO / n).stat().st_size for n in names.splitlines() if (REPO / n).is_file())
    assert size < 10_000_000, f"docs/results/ holds {size:,} bytes of tracked files: keep what the READMEs cite"
