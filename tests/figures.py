"""A figure in a doc comes from a file: the checker behind tests/test_doc_figures.py.

A Markdown page is cut into blocks (a paragraph, a list item, a table row); each block's figures are looked up
in the files the block cites (a link or a path in backticks), in its table's caption (the paragraph just above
the table) and in its section's headings. A figure is found when a value of a cited file, printed at the
figure's precision, reads the same (a share may be a fraction in the file and a percentage in the doc, a time
seconds in one and milliseconds in the other). A range ("234-325 ms", "-36.9 % to +2.4 %") must be one column's
smallest and largest value in a table or JSON file (a key's values over the files cited), not two figures found
anywhere: that is how a range that leaves out the rows that do not fit, or "in every cell" over six cells that
read otherwise, is caught. A block with figures and no cited file fails.

Not figures: code spans, code blocks, link targets, HTML comments, versions (0.25.1), dates, clock times,
numbers glued to letters (H200, ctx128, 31B, 1K), headings, a table's header row, and the numbers after a word
of ``doc_figures_allow.yaml``'s ``names`` (a section, a port, CUDA's major version). ``figures`` there lists
single figures of a page that are not measurements, each with its reason.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
READABLE = (
    ".parquet",
    ".csv",
    ".csv.gz",
    ".json",
    ".json.gz",
    ".jsonl",
    ".yaml",
    ".yml",
    ".md",
    ".txt",
    ".log",
    ".log.gz",
    ".lock",
    ".prom",
    ".py",  # a setting's value where it is defined (`clientcheck.py`'s TICK_S)
    ".smk",
    ".toml",
)
SCALES = (1.0, 100.0, 0.01, 1000.0, 0.001)  # same unit, fraction <-> percent, s <-> ms

_NUM = r"[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_UNIT = r"(?:\s?(?:%|ms|µs|s|min|minutes?|W|GiB|GB|MiB|MB|tok/s|req/s|x|×|M\b))?"
FIGURE = re.compile(
    rf"(?<![\w.\-/:#@+−^=])(?P<a>{_NUM})(?P<ua>{_UNIT})"
    rf"(?:\s?(?:–|-|to)\s?(?P<b>{_NUM})(?P<ub>{_UNIT}))?"
    rf"(?![\w]|\.\d|/\d|-[A-Za-z])"
)
# cut before figures are read: things that look like numbers and are not figures
NOT_FIGURES = [
    re.compile(r"```.*?```", re.S),
    re.compile(r"<!--.*?-->", re.S),
    re.compile(r"`[^`\n]*`"),
    re.compile(r"\]\([^)]*\)"),
    re.compile(r"https?://\S+"),
    re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2})?)?\b"),
    re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[-–]\s?\d{1,2}:\d{2}(?::\d{2})?)?\b"),
    re.compile(r"\b\d+(?:\.\d+){2,}\S*"),
    re.compile(r"\b[0-9a-f]{7,40}\b"),
]
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+")
# units that scale a figure: (factor to the file's unit, the precision that replaces the printed one)
UNIT_SCALE = {"min": (60.0, "minutes"), "minute": (60.0, "minutes"), "minutes": (60.0, "minutes"), "M": (1e6, -6)}
# a size in a unit of bytes: the file may hold the bytes (at the printed precision: "1,093 MB" is 1,093 ± 0.5 MB)
BYTES = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "MiB": 2.0**20, "GiB": 2.0**30}
TEXT_NUMBER = re.compile(r"(?<![0-9a-fA-F_.])[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+\-]?\d+)?")


@dataclass
class Figure:
    text: str
    low: float
    low_decimals: int
    high: float | None = None
    high_decimals: int = 0
    signed: bool = False
    interval: bool = False  # "1,655 (1,543-1,767)": a range in brackets after a figure, its interval
    in_bytes: float | None = None  # "1,093 MB": a file may hold the megabytes or the bytes


@dataclass
class Block:
    line: int
    kind: str  # paragraph, item (its marker left out), row
    text: str
    cites: list[str] = field(default_factory=list)  # raw citations of the block and its captions
    table: int = 0  # a row's table (its first line), 0 for other blocks


@dataclass
class Values:
    """What a file holds: every number, and the numbers of each column or JSON key (for ranges)."""

    numbers: list[float] = field(default_factory=list)
    columns: dict[str, list[float]] = field(default_factory=dict)
    rows: list[list[float]] = field(default_factory=list)  # a table's rows, a JSON object's own numbers


def _float(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def figures_in(text: str, names: list[str]) -> list[Figure]:
    for pattern in NOT_FIGURES:
        text = pattern.sub(" ", text)
    text = text.replace("½", ".5")  # "about 7½ minutes"
    name_before = re.compile(r"(?:^|\W)(?:" + "|".join(re.escape(n) for n in names) + r")\s?$", re.I) if names else None
    found = []
    pos = 0
    while m := FIGURE.search(text, pos):
        pos = m.end()
        before = text[max(0, m.start() - 40) : m.start()]
        if name_before and name_before.search(before):
            continue
        a, b, unit = m.group("a"), m.group("b"), m.group("ua").strip()
        if b is not None and re.search(r"\bfrom\s$", before):  # "from 25.5 s to 53.6 s": two figures, not a range
            found += figures_in(text[m.start() : m.start() + len(a + m.group("ua"))], [])
            found += figures_in(text[m.start("b") : m.end()], [])
            continue
        factor, precision = UNIT_SCALE.get(unit, (1.0, None))
        # "7 min 29 s" is one figure in seconds
        compound = re.match(r"\s?(\d+) s\b", text[m.end() :]) if factor == 60.0 and b is None else None
        if compound:
            found.append(Figure(m.group(0) + compound.group(0), _float(a) * 60 + int(compound.group(1)), 0))
            pos = m.end() + compound.end()
            continue
        if b is None and not unit and "." not in a and a[0] not in "+-−" and _float(a) <= 16:
            continue  # a count or a setting ("16 at once", "3 repeats"): matches almost any file
        fig = Figure(m.group(0).strip(), _float(a) * factor, _decimals(a), signed=a[0] in "+-−",
                     in_bytes=BYTES.get(unit))
        if precision == "minutes":
            fig.low_decimals = MINUTES  # whole minutes: half a minute either side
        elif precision is not None:  # "1.31 M tokens": millions, at their printed precision
            fig.low_decimals += precision
        if b is not None:
            fig.high, fig.high_decimals = _float(b) * factor, _decimals(b)
            fig.interval = before.rstrip().endswith("(")
            if a[0] not in "+-−" and b[0] in "-−" and not unit:
                # "234-325" read as 234 and -325 is a range with a hyphen
                fig.high = abs(fig.high)
        found.append(fig)
    return found


MINUTES = -100  # the precision of "about 5 minutes": half a minute either side, in seconds


def _tolerance(decimals: int) -> float:
    return 30.0 if decimals == MINUTES else 0.5 * 10 ** (-decimals) + 1e-9


def _matches(x: float, want: float, decimals: int, signed: bool) -> bool:
    if not math.isfinite(x):
        return False
    tol = _tolerance(decimals)
    for s in SCALES if decimals != MINUTES else (1.0,):
        v = x * s
        if abs((v if signed else abs(v)) - want) <= tol * (1 + 1e-9):
            return True
    return False


# ---------------------------------------------------------------- reading files


def _text_numbers(text: str) -> list[float]:
    out = [int(m) * 60 + int(s) for m, s in re.findall(r"\b(\d+) min (\d+) s\b", text)]
    out += [int(m) * 60 + float(s) for m, s in re.findall(r"\b(\d+)m(\d+(?:\.\d+)?)s\b", text)]  # time's 1m33.376s
    out += [int(h) * 3600 + int(m) * 60 + float(s) for h, m, s in re.findall(r"\b(\d+):(\d\d):(\d\d(?:\.\d+)?)", text)]
    for m in TEXT_NUMBER.finditer(text):
        try:
            out.append(_float(m.group(0)))
        except ValueError:
            pass
    return out


def _walk(obj, key: str, values: Values) -> None:
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        values.numbers.append(float(obj))
        values.columns.setdefault(key, []).append(float(obj))
    elif isinstance(obj, str):
        values.numbers.extend(_text_numbers(obj))
        try:  # a figure kept as text ("23.4") is still one value of its key
            values.columns.setdefault(key, []).append(_float(obj.strip()))
        except ValueError:
            pass
    elif isinstance(obj, dict):
        own = [float(v) for v in obj.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        own += [
            float(x)
            for v in obj.values()
            if isinstance(v, list)
            for x in v
            if isinstance(x, (int, float)) and not isinstance(x, bool)
        ]
        if len(own) > 1:
            values.rows.append(own)
        values.numbers.append(float(len(obj)))  # "196 wheels": a mapping's size, keyed by name
        for k, v in obj.items():
            _walk(v, str(k), values)
    elif isinstance(obj, list):
        values.numbers.append(float(len(obj)))  # "196 wheels": a list's length, as a table's count of rows
        for v in obj:
            _walk(v, key, values)


def _open_text(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode(errors="replace")


@functools.cache
def values_of(path: Path) -> Values:
    import pandas as pd

    values = Values()
    name = path.name
    if name.endswith((".parquet", ".csv", ".csv.gz")):
        if name.endswith(".parquet"):
            frame = pd.read_parquet(path, use_threads=False)  # Arrow's threads can abort an exit (bench/doc_blocks.py)
        else:
            frame = pd.read_csv(io.StringIO(_open_text(path)))
        for col in frame.columns:
            series = frame[col]
            if series.dtype == object:
                for v in series.dropna():
                    values.numbers.extend(_text_numbers(str(v)))
                series = pd.to_numeric(series, errors="coerce")
            nums = [float(v) for v in series.dropna() if not isinstance(v, bool)] if series.dtype != bool else []
            values.numbers.extend(nums)
            values.columns[str(col)] = nums
        values.numbers.append(float(len(frame)))  # "38 cells": a table's count of rows
        numeric = frame.select_dtypes("number")
        values.rows.extend([float(x) for x in row if x == x] for row in numeric.itertuples(index=False))
    elif name.endswith((".json", ".json.gz")):
        _walk(json.loads(_open_text(path)), "", values)
    elif name.endswith(".jsonl"):
        for line in _open_text(path).splitlines():
            if line.strip():
                _walk(json.loads(line), "", values)
    elif name.endswith((".yaml", ".yml")):
        _walk(yaml.safe_load(_open_text(path)), "", values)
        values.numbers.extend(_text_numbers(_open_text(path)))
    else:
        values.numbers.extend(_text_numbers(_open_text(path)))
    return values


def _module_file(cite: str) -> list[Path]:
    """The source file a Python name cites: `speedmatrix.measure.clientcheck`, `speedmatrix.measure.loops.detect`,
    `clientcheck.TICK_S`, `stats.nearest_rank` (a module of the package named by its last dotted part)."""
    if not re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)+", cite):
        return []
    parts = cite.split(".")
    src = REPO / "src"
    if parts[0] == "speedmatrix":
        for i in range(len(parts), 1, -1):
            for p in (src.joinpath(*parts[:i]).with_suffix(".py"), src.joinpath(*parts[:i], "__init__.py")):
                if p.is_file():
                    return [p]
        return []
    found = sorted((src / "speedmatrix").rglob(f"{parts[0]}.py"))
    return found if len(found) == 1 else []


def resolve(cite: str, doc: Path) -> list[Path]:
    """The readable tracked files a citation names (a path, a glob, `cells/<config>/*.json`, a module)."""
    cite = cite.strip().split("#", 1)[0].split("?", 1)[0]
    cite = re.sub(r"<[^>]+>", "*", cite)
    if not cite or " " in cite or cite.startswith(("http:", "https:", "/", "~")):  # not a file of the repository
        return []
    found: list[Path] = []
    for root in (doc.parent, REPO):
        if any(ch in cite for ch in "*?["):
            try:
                found = sorted(p for p in root.glob(cite) if p.is_file())
            except ValueError:  # not a pattern pathlib takes ("a**b")
                found = []
        else:
            p = root / cite
            found = [p] if p.is_file() else []
        if found:
            break
    if not found and not re.search(r"\.(?:md|json|jsonl|yaml|yml|csv|txt|log|gz|parquet|lock|prom|html|png|sh)$", cite):
        found = _module_file(cite.strip("()"))
    return [p.resolve() for p in found if p.name.endswith(READABLE)]


CITE = re.compile(r"`([^`\n]+)`|\]\(([^)\s]+)\)")


def citations(text: str) -> list[str]:
    return [a or b for a, b in CITE.findall(text)]


# ---------------------------------------------------------------- cutting a page into blocks


def blocks(doc: Path) -> list[Block]:
    """Paragraphs, list items and table rows, each with the citations of its captions."""
    lines = doc.read_text().splitlines()
    out: list[Block] = []
    headings: list[tuple[int, str]] = []  # (level, text) of the section chain
    para: list[str] = []
    para_start = 0
    last_para = ""  # the paragraph just above (a table's caption, a list's lead)
    in_code = False
    in_generated = False
    table_caption = ""
    in_table = False
    in_list_lead = ""
    section_line = 0
    table_start = 0

    def heading_cites() -> list[str]:
        return [c for _, h in headings for c in citations(h)]

    def flush():
        nonlocal para, last_para, in_list_lead
        if para:
            text = " ".join(s.strip() for s in para)
            is_item = bool(ITEM.match(para[0]))
            lead = in_list_lead if is_item else ""
            text = ITEM.sub("", text, count=1)  # a list item's marker ("7.") is not a figure
            out.append(
                Block(
                    para_start,
                    "item" if is_item else "paragraph",
                    text,
                    citations(text) + citations(lead) + heading_cites(),
                )
            )
            last_para = text  # a table's caption is the paragraph or item just above it
            if not is_item:
                in_list_lead = text
        para = []

    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("<!-- generated"):
            flush()
            in_generated = True
            continue
        if in_generated:
            if stripped.startswith("<!-- end generated"):
                in_generated = False
            continue
        if stripped.startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            continue
        if stripped.startswith("|"):
            if not in_table:
                flush()
                in_table, table_caption, table_start = True, last_para, n
                continue
            if re.fullmatch(r"\|[\s:|-]+\|?", stripped):
                continue
            out.append(
                Block(
                    n,
                    "row",
                    stripped,
                    citations(stripped) + citations(table_caption) + heading_cites(),
                    table=table_start,
                )
            )
            continue
        in_table = False
        m = re.match(r"(#+)\s+(.*)", stripped)
        if m:
            flush()
            level = len(m.group(1))
            headings = [(lv, h) for lv, h in headings if lv < level] + [(level, m.group(2))]
            last_para, in_list_lead, section_line = "", "", n
            continue
        if not stripped:
            flush()
            continue
        if ITEM.match(line) and para:
            flush()
        if not para and line.startswith("    ") and not ITEM.match(line):
            in_item = out and out[-1].kind == "item" and out[-1].line > section_line
            if not in_item or line.startswith("      "):
                continue  # an indented code block (inside a list item: four past the item's text)
        if not para:
            para_start = n
        para.append(line)
    flush()
    return out


# ---------------------------------------------------------------- checking


def _found(fig: Figure, files: list[Path]) -> bool:
    def at(value: float, decimals: int) -> bool:
        return any(any(_matches(x, value, decimals, fig.signed) for x in values_of(f).numbers) for f in files)

    if fig.in_bytes is not None and at(fig.low * fig.in_bytes, fig.low_decimals - round(math.log10(fig.in_bytes))):
        return True
    return at(fig.low, fig.low_decimals)


def _range_found(fig: Figure, files: list[Path]) -> bool:
    """A range is one column's (one key's) smallest and largest value over the cited files, or an interval: both
    ends in one row of a table or one JSON object."""
    for f in files if fig.interval else []:
        for row in values_of(f).rows:
            if any(_matches(x, fig.low, fig.low_decimals, fig.signed) for x in row) and any(
                _matches(x, fig.high, fig.high_decimals, True) for x in row
            ):
                return True
    columns: dict[str, list[float]] = {}
    text_only = True
    for f in files:
        vals = values_of(f)
        if vals.columns:
            text_only = False
        for k, v in vals.columns.items():
            columns.setdefault(k, []).extend(v)
    for col in columns.values():
        finite = [x for x in col if math.isfinite(x)]
        for signed in (True, False) if finite else ():
            if _matches(min(finite), fig.low, fig.low_decimals, signed) and _matches(
                max(finite), fig.high, fig.high_decimals, signed
            ):
                return True
    if text_only:  # a range quoted from a page or a log: both ends printed there
        low = Figure(fig.text, fig.low, fig.low_decimals, signed=fig.signed)
        high = Figure(fig.text, fig.high, fig.high_decimals)
        return _found(low, files) and _found(high, files)
    return False


def derived(fig: Figure, others: list[Figure]) -> bool:
    """A signed percentage that is the change between two other figures of its block ("+7.1 %" beside 1,655 and
    1,773), computed from them as printed."""
    if not fig.signed or fig.high is not None or not fig.text.rstrip().endswith("%"):
        return False
    for x in others:
        for y in others:
            if x is y or x is fig or y is fig or x.high is not None or y.high is not None or x.low == 0:
                continue
            change = 100 * (y.low / x.low - 1)
            slack = (
                100
                * abs(y.low / x.low)
                * (_tolerance(x.low_decimals) / abs(x.low) + _tolerance(y.low_decimals) / abs(y.low) if y.low else 0)
            )
            if abs(change - fig.low) <= _tolerance(fig.low_decimals) + slack:
                return True
    return False


def table_columns(rows: list[Block], names: list[str]) -> dict[int, list[Figure]]:
    """A table's figures by column: a change in one column is checked against two values of another."""
    columns: dict[int, list[Figure]] = {}
    for row in rows:
        for i, cell in enumerate(row.text.strip().strip("|").split("|")):
            columns.setdefault(i, []).extend(figures_in(cell, names))
    return columns


def _derived_in_table(fig: Figure, columns: dict[int, list[Figure]]) -> bool:
    return any(derived(fig, col) for col in columns.values() if fig not in col)


def check(doc: Path, allow: dict) -> list[str]:
    """Every problem of one page: a figure not found in its block's files, a block with figures and no file."""
    rel = doc.relative_to(REPO).as_posix()
    names = allow.get("names", [])
    allowed = {str(e["figure"]) for e in allow.get("figures", []) if e["doc"] == rel}
    problems = []
    found_blocks = blocks(doc)
    own_output = doc.with_suffix(".tail.txt")
    tables: dict[int, dict[int, list[Figure]]] = {}
    for t in {b.table for b in found_blocks if b.table}:
        tables[t] = table_columns([b for b in found_blocks if b.table == t], names)
    for block in found_blocks:
        figs = [f for f in figures_in(block.text, names) if f.text not in allowed]
        columns = tables.get(block.table, {})
        figs = [f for f in figs if not derived(f, figs) and not _derived_in_table(f, columns)]
        if not figs:
            continue
        groups = [g for g in (resolve(c, doc) for c in block.cites) if g]
        if own_output.is_file():  # a CI record's own output, kept beside it, backs every block of the record
            groups.append([own_output.resolve()])
        files = sorted({p for g in groups for p in g})
        where = f"{rel}:{block.line}"
        if not files:
            problems.append(
                f"{where}: {len(figs)} figure(s) ({', '.join(f.text for f in figs[:4])}) and no file cited: "
                f"{block.text[:100]}"
            )
            continue
        for fig in figs:
            if fig.high is not None:  # a range: one citation's files at a time, then all of them
                ok = any(_range_found(fig, g) for g in [*groups, files])
            else:
                ok = _found(fig, files)
            if not ok:
                kind = "range not one column's min-max" if fig.high is not None else "not found"
                names_ = ", ".join(p.relative_to(REPO).as_posix() for p in files[:3])
                problems.append(f"{where}: {fig.text!r} {kind} in {names_}{' ...' if len(files) > 3 else ''}")
    return problems


def load_allow() -> dict:
    return yaml.safe_load((Path(__file__).parent / "doc_figures_allow.yaml").read_text()) or {}
