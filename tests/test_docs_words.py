"""The repository speaks of the product only: no word of the place it is developed in (its machines, how GPU
hosts are obtained, held or lost there, its task numbers, paths on its disks) in any tracked text file: source,
config, tests, bench, docs, the Makefile and the recorded results. A reader elsewhere must be able to follow
every sentence."""

import re
import subprocess

from conftest import REPO

# phrases of the development setting, and what the product says instead
WORKPLACE = {
    r"development (VM|machine)": "the machine's kind (a 2-core x86_64 virtual machine)",
    r"GPU kit|gpukit": "what was installed (the packages and their pins)",
    r"device time|GPU time(?!-)": "how long the run took",
    r"taken back|handed back|\blent\b|\blending\b|could be had": "what happened to the run (the host went down)",
    r"idle window|host's time|time on the host": "what the run did (it stopped; it did not reach a step)",
    r"\b(?:issue|task)s? #?\d+|(?:^|[\s(])#\d{2,3}\b(?![\w-])": "what the change does, not its ticket",
}
# paths of the machine a text was written on; recorded outputs (a run's JSON, CSV, logs) keep the paths their
# run had, as the run wrote them
PATHS = {r"/work/|\.\./shared|git clone /": "a path of the repository, or `git clone <repository>`"}
RECORDED = (".json", ".jsonl", ".csv", ".log", ".txt", ".prom")
# "lease": the server lifecycle's own file (servers/<id>/lease) is a product word; in a results README or a CI
# record the word is the lending of a GPU host
RESULTS_ONLY = {r"(?<![/_`])\blease\b": "the host, or the run"}


def tracked_texts() -> list:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = []
    for name in names.splitlines():
        path = REPO / name
        if path == REPO / "tests" / "test_docs_words.py" or not path.is_file():
            continue
        try:
            found.append((name, path.read_text()))
        except UnicodeDecodeError:  # images, parquet, compressed records
            continue
    return found


def test_every_tracked_file_speaks_of_the_product():
    texts = tracked_texts()
    assert len(texts) > 300, "git ls-files found too few files: is this a checkout?"
    problems = []
    for name, text in texts:
        rules = dict(WORKPLACE)
        if not (name.startswith(("docs/results/", "bench/results/")) and name.endswith(RECORDED)):
            rules.update(PATHS)
        if name.startswith("docs/results/") and name.endswith(".md") or name.startswith("docs/results/ci/"):
            rules.update(RESULTS_ONLY)
        for n, line in enumerate(text.splitlines(), 1):
            for pattern, instead in rules.items():
                if re.search(pattern, line, flags=re.I):
                    problems.append(f"{name}:{n}: {pattern!r} (say {instead}): {line.strip()[:120]}")
    assert not problems, "\n".join(problems)


def test_the_rules_catch_what_they_were_written_for():
    said = [
        "the host was taken back during the first run",
        "two H200s of the lent nvidia-h200-x2 machine",
        "a 30 s idle window between commands",
        "all the host's time allowed",
        "no GPU host of either kind could be had",
        "# Issue 18: two one-GPU server configs",
        "fixed in #64",
    ]
    for line in said:
        assert any(re.search(p, line, flags=re.I) for p in WORKPLACE), line
    product = ["the GPU's idle power", "servers/<id>/lease", "a #4c78a8 bar", "# 1. the first step", "--gpus=h100:2"]
    for line in product:
        assert not any(re.search(p, line, flags=re.I) for p in WORKPLACE), line
