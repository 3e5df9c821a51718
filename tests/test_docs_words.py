"""The docs speak the product's words: no word of the place the project is developed in (its machines, how GPU
time is lent there, paths on its disks) in the front page, the docs, the decision records, the results READMEs
and the CI records. A reader elsewhere must be able to follow every sentence."""

import re

from conftest import REPO

# phrases of the development setting, and what a user doc says instead
WORKPLACE = {
    r"development (VM|machine)": "the machine's kind (a 2-core x86_64 virtual machine)",
    r"GPU kit|gpukit": "what was installed (the packages and their pins)",
    r"device time|GPU time(?!-)": "how long the run had on the host",
    r"/work/|\.\./shared": "a path of the repository",
    r"git clone /": "`git clone <repository>`",
}
# "lease": the server lifecycle's own file (servers/<id>/lease) is a product word; in a results README or a CI
# record the word is the lending of a GPU host
RESULTS_ONLY = {r"(?<![/_`])\blease\b": "the host, or the run"}


def docs() -> list:
    found = [REPO / "README.md", REPO / "bench" / "results" / "README.md"]
    found += sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "docs" / "decisions").glob("*.md"))
    found += sorted((REPO / "docs" / "results").rglob("*.md"))
    # the recorded outputs beside them are read as evidence too
    found += sorted((REPO / "docs" / "results").rglob("*.txt")) + sorted((REPO / "bench" / "results").rglob("*.txt"))
    return found


def test_no_workplace_words_in_the_docs():
    problems = []
    for path in docs():
        rel = path.relative_to(REPO)
        rules = {**WORKPLACE, **(RESULTS_ONLY if rel.parts[:2] == ("docs", "results") else {})}
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for pattern, instead in rules.items():
                if re.search(pattern, line, flags=re.I):
                    problems.append(f"{rel}:{n}: {pattern!r} (say {instead}): {line.strip()[:120]}")
    assert not problems, "\n".join(problems)
