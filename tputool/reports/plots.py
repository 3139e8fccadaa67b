"""matplotlib set-up shared by the reports' plots: a Figure on the SVG backend (no pyplot state, no Agg), text
kept as SVG <text> (selectable, searchable), and the SVG made ready to sit inline next to others in one page."""

from __future__ import annotations

import io
import re
from typing import Any

COLORS = {"blue": "#4e79a7", "orange": "#f28e2b", "red": "#d62728", "green": "#59a14f", "grey": "#9aa0a6",
          "purple": "#b07aa1", "teal": "#76b7b2", "yellow": "#edc948", "brown": "#9c755f"}
STYLE = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
         "axes.titlesize": 10, "axes.titleweight": "bold", "svg.hashsalt": "tputool"}

_ID = re.compile(r'\bid="([^"]+)"')
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def style() -> Any:
    """The reports' matplotlib settings, as a context to draw a plot in (they are read when artists are made)."""
    import matplotlib

    return matplotlib.rc_context(STYLE)


def new_figure(width: float, height: float, **subplots: Any) -> tuple[Any, Any]:
    """A Figure of `width` x `height` inches on the SVG canvas and its axes (`subplots` go to `subplots()`);
    call it, draw and export inside `style()`."""
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasSVG(fig)
    return fig, fig.subplots(**subplots)


def to_svg(fig: Any, name: str) -> str:
    """The figure as an inline <svg> element whose ids (and references to them) are prefixed with `name`,
    so several plots in one page never share an id."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    svg = _METADATA.sub("", svg[svg.index("<svg"):])  # the RDF block names URLs a page need not carry
    for old in sorted(set(_ID.findall(svg)), key=len, reverse=True):
        new = f"{name}-{old}"
        svg = svg.replace(f'id="{old}"', f'id="{new}"').replace(f"#{old})", f"#{new})") \
                 .replace(f'"#{old}"', f'"#{new}"')
    return svg


def short(x: float | None, unit: str = "") -> str:
    """A number in 3 significant digits (`-` for None), with `unit` after it."""
    if x is None:
        return "-"
    text = f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return f"{text} {unit}".rstrip()
