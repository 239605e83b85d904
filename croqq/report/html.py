"""The report page: one self-contained HTML file (inline CSS, images as ``data:`` URIs, no script, no
link to anything outside the file), so it opens offline, from a mail attachment or a CI artifact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1250px; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .3rem; } h2 { border-bottom: 1px solid #ddd; margin-top: 2rem; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .1rem 1rem; font-size: .9rem; }
dl.meta dt { color: #666; } dl.meta dd { margin: 0; font-family: monospace; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0; }
th, td { border: 1px solid #ddd; padding: .2rem .5rem; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
div.figs { display: flex; flex-wrap: wrap; gap: .5rem 1.5rem; align-items: flex-start; }
figure { margin: .5rem 0; } figure img { max-width: 100%; } figcaption { font-size: .85rem; color: #555; }
p.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: .4rem .7rem; font-size: .9rem; }
details summary { cursor: pointer; font-weight: 600; }
"""


@dataclass(frozen=True)
class Image:
    id: str
    uri: str
    alt: str
    caption: str = ""


@dataclass(frozen=True)
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    collapsed: str = ""  # non-empty: shown folded, under this summary line


@dataclass
class Section:
    id: str
    title: str
    intro: str = ""
    images: list[Image] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _table(t: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>\n" for row in t.rows)
    html = f"<table><thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table>"
    return f"<details><summary>{escape(t.collapsed)}</summary>{html}</details>" if t.collapsed else html


def _image(img: Image) -> str:
    caption = f"<figcaption>{escape(img.caption)}</figcaption>" if img.caption else ""
    return f'<figure id="{escape(img.id)}"><img src="{img.uri}" alt="{escape(img.alt)}">{caption}</figure>'


def _section(s: Section) -> str:
    parts = [f'<section id="{escape(s.id)}">', f"<h2>{escape(s.title)}</h2>"]
    if s.intro:
        parts.append(f"<p>{escape(s.intro)}</p>")
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
    parts += [_table(t) for t in s.tables]
    if s.images:
        parts.append('<div class="figs">' + "\n".join(_image(i) for i in s.images) + "</div>")
    parts.append("</section>")
    return "\n".join(parts)


def page(title: str, meta: Sequence[tuple[str, str]], sections: Sequence[Section]) -> str:
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in meta)
    body = "\n".join(_section(s) for s in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="generator" content="croqq report">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n"
        f'<body><header id="header"><h1>{escape(title)}</h1><dl class="meta">{rows}</dl></header>\n'
        f"{body}\n</body></html>\n"
    )
