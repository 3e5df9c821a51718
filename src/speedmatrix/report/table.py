"""A document as data, and its two renderers: markdown (git diffs, terminals) and HTML (browsers).

A report is a list of blocks: :class:`Heading`, :class:`Para` (text with
`code` spans), :class:`Bullets`, :class:`Table` and :class:`Image`. Each
renderer walks the same blocks, so the HTML has real lists, code and tables
instead of a re-parse of the markdown. Imports nothing of speedmatrix.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass, field


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
class Table:
    """Column names and rows of text (a figure is formatted before it is added)."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])

    def __len__(self) -> int:
        return len(self.rows)


Block = Heading | Para | Bullets | Image | Table


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
        elif isinstance(b, Table):
            out.append(table_markdown(b))
        else:
            raise TypeError(f"not a report block: {b!r}")
    return "\n\n".join(out) + "\n"


# ---- HTML ------------------------------------------------------------------

_CODE = re.compile(r"`([^`]+)`")


def inline_html(text: str) -> str:
    """Text with `code` spans: escaped, the spans as <code>."""
    parts = _CODE.split(text)
    return "".join(f"<code>{html.escape(p)}</code>" if k % 2 else html.escape(p) for k, p in enumerate(parts))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def table_html(t: Table) -> str:
    head = "".join(f"<th>{inline_html(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.4}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
         "text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}"
         "code{background:#f4f4f4;padding:0 3px}img{max-width:100%}")


def html_page(blocks: Iterable[Block], title: str) -> str:
    body: list[str] = []
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
        elif isinstance(b, Table):
            body.append(table_html(b))
        else:
            raise TypeError(f"not a report block: {b!r}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>")
