"""The page shell of the HTML reports: one self-contained document (inline CSS, inline SVG, no scripts)."""

from __future__ import annotations

import html
from collections.abc import Iterable

from tputool import __version__

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #1b1f24; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.8em; }
.verdict { font-size: 1.1em; font-weight: 600; margin: 0.6em 0; }
.facts { color: #57606a; margin: 0.2em 0; }
figure.plot { margin: 1em 0; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { color: #57606a; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.8em 0; }
th, td { border-bottom: 1px solid #d0d7de; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.mark td { background: #fff4e5; font-weight: 600; }
.sev-error { color: #cf222e; font-weight: 600; } .sev-warning { color: #9a6700; font-weight: 600; }
.sev-info { color: #0969da; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.92em; }
footer { color: #8c959f; font-size: 0.8em; margin-top: 3em; }
"""


def esc(x: object) -> str:
    """`x` as HTML text."""
    return html.escape("" if x is None else str(x))


def table(headers: list[str], rows: Iterable[list[object]], *, numeric: Iterable[int] = (),
          marked: Iterable[int] = (), name: str = "") -> str:
    """An HTML table (no header row when every header is empty); cells are escaped; columns in `numeric` align right; rows in `marked` are highlighted."""
    num, mark = set(numeric), set(marked)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers) if any(headers) else ""
    body = []
    for i, row in enumerate(rows):
        cells = "".join(f'<td class="num">{esc(c)}</td>' if j in num else f"<td>{esc(c)}</td>"
                        for j, c in enumerate(row))
        body.append(f'<tr class="mark">{cells}</tr>' if i in mark else f"<tr>{cells}</tr>")
    attr = f' id="table-{esc(name)}"' if name else ""
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f"<table{attr}>{thead}<tbody>{''.join(body)}</tbody></table>"


def figure(name: str, svg: str, caption: str) -> str:
    """A plot (inline SVG) with its caption."""
    return f'<figure class="plot" id="plot-{esc(name)}">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


def section(title: str, *parts: str) -> str:
    """A titled section of already-rendered parts."""
    return f"<section><h2>{esc(title)}</h2>{''.join(parts)}</section>"


def para(text: str, cls: str = "") -> str:
    """A paragraph of plain text."""
    return f'<p class="{cls}">{esc(text)}</p>' if cls else f"<p>{esc(text)}</p>"


def page(title: str, *parts: str) -> str:
    """The whole document: `title` as heading, then the parts."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><h1>{esc(title)}</h1>"
            f"{''.join(parts)}<footer>written by tputool {esc(__version__)}</footer></body></html>\n")
