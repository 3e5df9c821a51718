"""A document as data, and its two renderers: markdown (git diffs, terminals) and HTML (browsers).

A report is a list of blocks: :class:`Heading`, :class:`Para` (text with
`code` spans), :class:`Bullets`, :class:`Table`, :class:`Image` and
:class:`Figure` (a chart: its Vega-Lite spec for the page, its PNG for
markdown). Each renderer walks the same blocks, so the HTML has real lists,
code and tables instead of a re-parse of the markdown. The HTML page is one
self-contained file: its charts are drawn by the Vega JavaScript inlined once
(given by the caller), its tables sort by a click on a column, statuses have
one colour each, and a table of contents leads to every section. Imports
nothing of speedmatrix.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .status import Status


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Image:
    alt: str
    src: str


@dataclass
class Contents:
    """Where the page's table of contents and status legend go (HTML only; without one: before the first
    second-level heading)."""


@dataclass
class Figure:
    """A chart: drawn from ``spec`` (Vega-Lite, data inlined) on the page, shown as ``png`` in markdown."""

    title: str
    spec: dict
    png: str
    caption: str = ""


@dataclass
class Table:
    """Column names and rows of text (a figure is formatted before it is added)."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    # each row's anchor on the page (a link `[text](#anchor)` elsewhere leads to it), or None
    ids: list[str | None] = field(default_factory=list)

    def add(self, *cells: object, anchor: str | None = None) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])
        self.ids.append(anchor)

    def __len__(self) -> int:
        return len(self.rows)


Block = Heading | Para | Bullets | Image | Table | Figure | Contents


# ---- markdown --------------------------------------------------------------

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(t: Table) -> str:
    lines = ["| " + " | ".join(_md_cell(c) for c in t.columns) + " |", "|---" * len(t.columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def markdown(blocks: Iterable[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Image):
            out.append(f"![{b.alt}]({b.src})")
        elif isinstance(b, Figure):
            out.append(f"![{b.title}]({b.png})")
        elif isinstance(b, Table):
            out.append(table_markdown(b))
        elif isinstance(b, Contents):
            continue
        else:
            raise TypeError(f"not a report block: {b!r}")
    return "\n\n".join(out) + "\n"


# ---- HTML ------------------------------------------------------------------

_CODE = re.compile(r"`([^`]+)`")
# a link to an anchor of the page: [text](#anchor)
_LINK = re.compile(r"\[([^\]]+)\]\((#[a-z0-9-]+)\)")


def inline_html(text: str) -> str:
    """Text with `code` spans and [links](#anchor) to the page's anchors: escaped, the spans as <code>, the links
    as <a>."""
    parts = _CODE.split(text)
    return "".join(f"<code>{html.escape(p)}</code>" if k % 2 else _LINK.sub(r'<a href="\2">\1</a>', html.escape(p))
                   for k, p in enumerate(parts))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def _cell(text: str, statuses: dict[str, str]) -> str:
    """A table cell; one that starts with a status's label, or ends with it in brackets ("1,234.5 (Unstable)"),
    gets that status's colour."""
    for label, key in statuses.items():
        if text == label or text.startswith((label + " ", label + "(")) or text.endswith(f"({label})"):
            return f'<td class="st st-{key}">{inline_html(text)}</td>'
    return f"<td>{inline_html(text)}</td>"


def table_html(t: Table, statuses: dict[str, str] | None = None) -> str:
    head = "".join(f'<th title="sort">{inline_html(c)}</th>' for c in t.columns)
    ids = t.ids + [None] * (len(t.rows) - len(t.ids))
    body = "".join((f'<tr id="{html.escape(i)}">' if i else "<tr>") + "".join(_cell(c, statuses or {}) for c in row)
                   + "</tr>" for row, i in zip(t.rows, ids))
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# one colour per status (the same in the legend, the tables and the heatmap's labels)
STATUS_COLOURS = {Status.VALID: "#d9f2d9", Status.UNSTABLE: "#fff0c2", Status.LOOPED: "#f8d0d0",
                  Status.OVER_CAPACITY: "#e3e3e3", Status.CLIENT_BOUND: "#e4d7f5", Status.SATURATED: "#f5dcc4",
                  Status.LOSSY: "#f0c8e0", Status.ERROR: "#f4b4b4"}

STYLE = ("body{font-family:system-ui,sans-serif;max-width:1280px;margin:1em auto;padding:0 1em;line-height:1.35;"
         "color:#222}h1{margin:.2em 0;font-size:1.7em}h2{margin:.7em 0 .4em}h3{margin:.9em 0 .3em}p{margin:.5em 0}"
         "table{border-collapse:collapse;margin:.6em 0;font-size:14px}td,th{border:1px solid #ccc;"
         "padding:2px 8px;text-align:right}th{background:#f4f4f4;cursor:pointer;user-select:none}"
         "th.asc:after{content:' \\25B2'}th.desc:after{content:' \\25BC'}"
         "td:first-child,th:first-child{text-align:left}code{background:#f4f4f4;padding:0 3px}img{max-width:100%}"
         "nav.toc{background:#fafafa;border:1px solid #ddd;padding:.5em 1em;margin:1em 0}nav.toc a{margin-right:1em}"
         "header.prov{border-bottom:2px solid #ccc;margin-bottom:1em}figure.chart{margin:1em 0}"
         "figure.chart figcaption{color:#555;font-size:13px;max-width:900px}span.legend{padding:1px 8px;"
         "margin-right:6px;border:1px solid #ccc}"
         + "".join(f".st-{k}{{background:{v}}}" for k, v in STATUS_COLOURS.items()))

# click a column's head to sort its table (numbers by value: 1,234.5, 31.5K, 87 ms, 12.5%; then text)
SORT_JS = r"""
function smNum(t){t=t.replace(/,/g,'').trim();const m=t.match(/^([-+]?[0-9]*\.?[0-9]+)\s*(K)?/);
 if(!m)return null;return parseFloat(m[1])*(m[2]?1000:1);}
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){
 const col=th.cellIndex,table=th.closest('table'),body=table.tBodies[0],rows=Array.from(body.rows);
 const asc=!th.classList.contains('asc');table.querySelectorAll('th').forEach(h=>h.classList.remove('asc','desc'));
 th.classList.add(asc?'asc':'desc');
 rows.sort(function(a,b){const x=a.cells[col].innerText,y=b.cells[col].innerText,nx=smNum(x),ny=smNum(y);
  let c=(nx!==null&&ny!==null)?nx-ny:(nx!==null?-1:(ny!==null?1:x.localeCompare(y)));return asc?c:-c;});
 rows.forEach(r=>body.appendChild(r));});});
"""

EMBED_JS = r"""
document.querySelectorAll('div.vega').forEach(function(div){
 const spec=JSON.parse(document.getElementById(div.dataset.spec).textContent);
 vegaEmbed(div,spec,{actions:false,renderer:'svg'}).catch(function(e){console.error('chart '+div.id+': '+e);});});
"""


CONTENTS = "<!-- contents -->"


def html_page(blocks: Iterable[Block], title: str, vega_js: str | None = None,
              statuses: dict[str, str] | None = None, toc: bool = True) -> str:
    """One self-contained page. ``vega_js``: the Vega, Vega-Lite and vega-embed code (a page with figures and
    without it shows their PNG instead). ``statuses``: label -> key of the cells coloured as that status."""
    blocks = list(blocks)
    body: list[str] = []
    figures = 0
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f'<h{b.level} id="{slug(b.text)}">{inline_html(b.text)}</h{b.level}>')
        elif isinstance(b, Para):
            body.append(f"<p>{inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Image):
            body.append(f'<figure><img alt="{html.escape(b.alt)}" src="{html.escape(b.src)}">'
                        f"<figcaption>{html.escape(b.alt)}</figcaption></figure>")
        elif isinstance(b, Figure):
            figures += 1
            cap = f"<figcaption><b>{html.escape(b.title)}</b>. {inline_html(b.caption)}</figcaption>"
            if vega_js is None:
                body.append(f'<figure class="chart"><img alt="{html.escape(b.title)}" src="{html.escape(b.png)}">'
                            f"{cap}</figure>")
                continue
            spec = json.dumps(b.spec).replace("</", "<\\/")
            body.append(f'<figure class="chart" id="{slug(b.title)}"><div class="vega" id="chart-{figures}" '
                        f'data-spec="spec-{figures}"></div>{cap}</figure>'
                        f'<script type="application/json" id="spec-{figures}">{spec}</script>')
        elif isinstance(b, Table):
            body.append(table_html(b, statuses))
        elif isinstance(b, Contents):
            body.append(CONTENTS)
        else:
            raise TypeError(f"not a report block: {b!r}")
    nav = ""
    if toc:
        links = [f'<a href="#{slug(b.text)}">{inline_html(b.text)}</a>' for b in blocks
                 if isinstance(b, Heading) and b.level == 2]
        nav = f'<nav class="toc"><b>Contents</b>: {" ".join(links)}</nav>' if links else ""
    if statuses:
        legend = " ".join(f'<span class="legend st-{k}">{html.escape(label)}</span>' for label, k in statuses.items())
        nav += f"<p>Statuses: {legend}</p>"
    if CONTENTS in body:
        body[body.index(CONTENTS)] = nav
    else:
        body.insert(next((i for i, part in enumerate(body) if part.startswith("<h2")), len(body)), nav)
    body = [part for part in body if part != CONTENTS]
    scripts = f"<script>{SORT_JS}</script>"
    if vega_js is not None and figures:
        scripts += f"<script>{vega_js}</script><script>{EMBED_JS}</script>"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}{scripts}</body></html>")
