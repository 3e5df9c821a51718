"""The shape of the code: no import circle, one table of workload kinds, evidence links that resolve."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from speedmatrix import workloads
from speedmatrix.report import charts

PACKAGE = REPO / "src" / "speedmatrix"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every speedmatrix module ``path`` imports, at the top or inside a function."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from . import x` imports the submodule x
                if f"{target}.{alias.name}" in modules:
                    out.add(f"{target}.{alias.name}")
                elif target in modules:
                    out.add(target)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert {"speedmatrix.core.fmt", "speedmatrix.workloads.decode", "speedmatrix.jobs.job"} <= set(graph)
    # depth-first search for a cycle; report the first one found as a path
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path + [nxt]
            if not state.get(nxt):
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node):
            cycle = visit(node, [node])
            assert cycle is None, " -> ".join(cycle)


def layers_of_the_docs() -> list[str]:
    """docs/architecture.md's layer table: each row's folder (or module), lowest layer first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) < 2 or cols[0] in ("Layer", "") or set(cols[0]) <= {"-"}:
            continue
        (name,) = re.findall(r"`([^`]+)`", cols[0])
        out.append(name.rstrip("/").removesuffix(".py"))
    return out


def layer_of(module: str, layers: list[str]) -> int:
    """The row of a module: its folder's (the package's own ``__init__`` and ``data`` sit below every row)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] == "data":
        return -1
    key = parts[0]
    assert key in layers, f"{module} is in no layer of docs/architecture.md (a module belongs in a layer's folder)"
    return layers.index(key)


def test_the_folders_are_the_layers():
    """Every folder of the package is a row of docs/architecture.md's layer table, every module is in one (the
    package's root holds only its ``__init__`` and the CLI), and no import goes to a row below its own."""
    layers = layers_of_the_docs()
    assert layers[0] == "core" and layers[-1] == "cli"
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"data"}
    assert folders == set(layers) - {"cli"}
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose == {"__init__.py", "cli.py"}, f"modules outside the layers' folders: {loose}"
    graph = import_graph()
    row = {m: layer_of(m, layers) for m in graph}
    upward = [f"{m} ({layers[row[m]]}) imports {i} ({layers[row[i]]})"
              for m, imports in graph.items() for i in imports if row[i] > row[m]]
    assert upward == []


def docs_tree() -> dict[str, str]:
    """docs/architecture.md's tree of the package: folder -> the text that lists its modules."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("    src/speedmatrix/\n", 1)[1].split("\n\n", 1)[0]
    out: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = re.match(r"\s{6}(\S+)\s+(.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2)
        elif current:
            out[current] += " " + line.strip()
    return out


def test_the_tree_in_the_docs_is_the_package():
    """The tree in docs/architecture.md names every module of each layer's folder and nothing else; under
    workloads/ it names the shared modules, and every other module there is a registered kind's (a new kind is its
    module: the docs need no edit)."""
    tree = docs_tree()
    kind_modules = {type(workloads.get(n)).__module__.rsplit(".", 1)[1] for n in workloads.names()}
    for folder, listed in tree.items():
        if not folder.endswith("/") or folder == "data/":
            continue
        listed = re.sub(r"\([^)]*\)", "", listed)  # what a module is for, in brackets
        if folder == "workloads/":
            listed = listed.split("shared:", 1)[1]
        named = set(re.findall(r"[a-z_0-9]+", listed)) | (kind_modules if folder == "workloads/" else set())
        actual = {p.stem for p in (PACKAGE / folder).glob("*.py")} - {"__init__"}
        assert named == actual, (folder, sorted(named ^ actual))


def test_formatting_and_tables_import_nothing_of_speedmatrix():
    """The lowest modules: the statuses, the errors, numbers as text and tables (which name a status's label and
    colour, so they read the statuses, and nothing else)."""
    graph = import_graph()
    for name in ("speedmatrix.core.status", "speedmatrix.core.errors"):
        assert graph[name] == set(), (name, graph[name])
    for name in ("speedmatrix.core.fmt", "speedmatrix.core.table"):
        assert graph[name] <= {"speedmatrix.core.status"}, (name, graph[name])


def test_a_status_is_named_through_its_enumeration():
    """No module compares or sets a cell's status by its literal word: `Status` (core/status.py) names them."""
    literal = re.compile(r'(==|!=|\bin \(|isin\(\[?|"status":|\bstatus\s*=)\s*\(?\s*"(valid|unstable|over_capacity|'
                         r'looped|client_bound|saturated|lossy)"')
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in sorted((REPO / "src" / "speedmatrix").rglob("*.py"))
             if p.name != "status.py" for n, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not found, "\n".join(found)


def test_errors_are_defined_in_one_module():
    """Every exception class of the package is in core/errors.py, under SpeedmatrixError (one place to read
    what speedmatrix raises on purpose), and HTTP goes through aiohttp or core/http.py, never a third library."""
    from speedmatrix.core import errors

    elsewhere = [f"{p.relative_to(REPO)}: {node.name}" for p in PACKAGE.rglob("*.py") if p.name != "errors.py"
                 for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ClassDef)
                 and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in node.bases)]
    assert elsewhere == []
    ours = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, Exception)]
    assert len(ours) > 5 and all(issubclass(c, errors.SpeedmatrixError) for c in ours)
    http_imports = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                    if re.search(r"^\s*(import|from) (requests|httpx|urllib\.request)\b", p.read_text(), re.M)}
    assert http_imports == {"core/http.py"}


def test_workload_kinds_come_from_one_table():
    names = workloads.names()
    assert len(names) == len(set(names)) and "decode" in names
    # every kind is one module of the package, named for it (the other modules hold what kinds share: the docs'
    # tree names them, test_the_tree_in_the_docs_is_the_package)
    for name in names:
        assert type(workloads.get(name)).__module__ == f"speedmatrix.workloads.{name}"
    # nothing outside the kinds' package compares a workload to a literal kind name or picks a kind by its name:
    # a kind's traits (its class attributes) say what it is
    kinds = "|".join(names)
    pattern = re.compile(rf'workload"?\]?\s*(==|!=|in)\s*[\(\[]?"({kinds})"|workloads\.get\("({kinds})"\)'
                         rf'|"({kinds})" in _kinds_in|for \w+ in \("({kinds})",')
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in PACKAGE.rglob("*.py") if "workloads" not in p.parts
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
    # the SLURM profile names no kind: the rules declare their group
    profile = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    assert not any(re.search(rf"^\s*-?\s*{n}\s*[=:]", profile, re.M) for n in names)
    assert re.fullmatch(workloads.cell_id_pattern(), "prefix_cache-ctx1024-c4-share87.5")


def test_every_chart_has_its_caption():
    for chart in charts.CHARTS:
        assert (REPO / "docs" / "captions" / f"{chart.name}.rst").exists(), chart.name


def tracked_files() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return set(out.stdout.splitlines())


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_in_markdown_points_to_a_tracked_file():
    tracked = tracked_files()
    dirs = {str(p) for f in tracked for p in Path(f).parents}
    broken = []
    for md in sorted(f for f in tracked if f.endswith(".md")):
        for target in LINK.findall((REPO / md).read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same page
            resolved = ((REPO / md).parent / target.split("#")[0]).resolve()
            try:
                norm = str(resolved.relative_to(REPO.resolve()))
            except ValueError:
                broken.append(f"{md}: {target} (outside the repository)")
                continue
            if norm not in tracked and norm not in dirs:
                broken.append(f"{md}: {target}")
    assert broken == [], "links to files that are not tracked:\n" + "\n".join(broken)


def test_every_matrix_column_is_documented_with_its_source():
    """docs/metrics.md has a row for every matrix column and no other, and where the declaration
    (aggregate.COLUMNS) reads a column as it is from the cell's JSON, the row names that key as its source."""
    from speedmatrix.jobs.aggregate import COLUMNS, LOOPS, PROVENANCE, RESULT

    text = (REPO / "docs" / "metrics.md").read_text().split("## The requests table", 1)[0]
    source_of = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| Column"):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            for name in (c.strip() for c in cells[0].split(",")):
                source_of[name] = cells[2]
    names = [c.name for c in COLUMNS]
    assert set(names) - set(source_of) == set()
    assert set(source_of) - set(names) == set()
    wrong = []
    for c in COLUMNS:
        documented = source_of[c.name]
        if c.part == RESULT and f"`{c.source}`" not in documented:
            wrong.append(f"{c.name}: the result's `{c.source}`, the docs say {documented}")
        elif c.part == PROVENANCE and f"`provenance.{c.source}`" not in documented:
            wrong.append(f"{c.name}: `provenance.{c.source}`, the docs say {documented}")
        elif c.part == LOOPS and ("loops stage" not in documented
                                  or (c.source != c.name and f"`{c.source}`" not in documented)):
            wrong.append(f"{c.name}: the loop verdict's `{c.source}`, the docs say {documented}")
    assert wrong == []


def test_a_wheel_ships_the_schemas(tmp_path):
    """`pip install` of a wheel gives a package that finds its schemas outside the checkout."""
    import sys
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("speedmatrix-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"speedmatrix/data/schemas/experiment.schema.yaml", "speedmatrix/data/schemas/config.schema.yaml",
            "speedmatrix/workloads/decode.py", "speedmatrix/core/table.py"} <= names
    # the checkout's config/schemas is the package's own (a link), not a second copy
    assert (REPO / "config" / "schemas").resolve() == (PACKAGE / "data" / "schemas").resolve()


def test_the_conda_environment_takes_its_pins_from_the_lock():
    """envs/speedmatrix.yaml pins nothing itself: the package and its extra under requirements.lock, the one
    place the versions are written (a hand copy of the pins fell behind once)."""
    import yaml

    env = yaml.safe_load((REPO / "envs" / "speedmatrix.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "-c ../requirements.lock" in pip and "-e ..[cpu]" in pip
    assert not [line for line in pip if "==" in line], pip
    assert (REPO / "envs" / "../requirements.lock").exists()


def test_every_bench_script_is_in_bench_readme():
    listed = (REPO / "bench" / "README.md").read_text()
    missing = [p.name for p in sorted((REPO / "bench").glob("*.py")) if f"`{p.name}`" not in listed]
    assert not missing, f"bench/README.md does not say what these measure: {missing}"


def test_every_command_is_in_the_user_docs_with_its_help():
    """docs/running.md's command table is the parser's own list: a new subcommand is a new row, its words the
    parser's help."""
    import argparse

    from speedmatrix import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    rows = dict(re.findall(r"^\| `speedmatrix ([\w-]+)` \| (.*) \|$", (REPO / "docs" / "running.md").read_text(), re.M))
    helps = {a.dest: a.help for a in sub._choices_actions}
    differ = set(rows) ^ set(sub.choices)
    assert not differ, f"docs/running.md's command table against the parser: {differ}"
    wrong = {name: (rows[name], helps[name]) for name in rows if rows[name] != helps[name]}
    assert not wrong, f"docs/running.md's rows differ from the parser's help: {wrong}"


def test_every_bench_result_is_in_its_readme():
    listed = (REPO / "bench" / "results" / "README.md").read_text()
    missing = []
    for name in tracked_files():
        path = Path(name)
        if path.parts[:2] != ("bench", "results") or path.name == "README.md":
            continue
        folder = "/".join(path.parts[2:-1])
        if path.name not in listed and not (folder and f"{folder}/" in listed):
            missing.append(name)
    assert not missing, f"bench/results/README.md does not say which script wrote these: {missing}"


def test_the_front_page_stays_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines: it links the rest, under 150"


def test_every_requests_column_is_documented():
    """docs/metrics.md's requests table names every column the declaration gives and no other, and the loop stage
    gives per request exactly the columns declared for it."""
    from speedmatrix.judge import loopcheck
    from speedmatrix.measure import records

    text = (REPO / "docs" / "metrics.md").read_text().split("## The requests table", 1)[1].split("\n## ", 1)[0]
    documented = {name.strip() for line in text.splitlines() if line.startswith("| ") and not line.startswith(
        "| Column") for name in line.split("|")[1].split(",")}
    assert documented == set(records.TABLE), sorted(documented ^ set(records.TABLE))
    row = type("Row", (), {"text": "x", "request_index": 0, "chunk_chars": [1], "chunk_tokens": [1]})()
    assert set(loopcheck.judge_request(row, {})) == {"request_index", *records.LOOP_COLUMNS}
    assert set(records.STORED) <= set(records.TABLE)
