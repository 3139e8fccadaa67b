"""Helpers for the HTML report tests: the plots of a page, the text in a plot, the self-containment check,
and headless Chromium (the system package) to render a page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
CHROMIUM = "/usr/bin/chromium"
SVG_NS = "{http://www.w3.org/2000/svg}"
_FIGURE = re.compile(r'<figure class="plot" id="plot-([\w-]+)">(<svg.*?</svg>)', re.S)

pytest.importorskip("matplotlib", reason="the HTML reports need the report extra: pip install -e '.[report]'")


def plots_of(page: str) -> dict[str, ET.Element]:
    """Each plot of a page by name, parsed as XML (so a malformed SVG fails here)."""
    return {name: ET.fromstring(svg) for name, svg in _FIGURE.findall(page)}


def texts(svg: ET.Element) -> list[str]:
    """Every text the plot draws (axis labels, data labels, titles), in document order."""
    return ["".join(t.itertext()).strip() for t in svg.iter(f"{SVG_NS}text")]


def group(svg: ET.Element, suffix: str) -> ET.Element:
    """The <g> whose id ends with `suffix` (an artist's gid, prefixed by the plot's name)."""
    found = [g for g in svg.iter(f"{SVG_NS}g") if g.get("id", "").endswith(suffix)]
    assert len(found) == 1, (suffix, [g.get("id") for g in found])
    return found[0]


def markers(g: ET.Element) -> int:
    """How many markers a line's group draws (one <use> each)."""
    return sum(1 for _ in g.iter(f"{SVG_NS}use"))


def table_rows(page: str, name: str) -> list[list[str]]:
    """The body rows of the table `name` as cell texts."""
    m = re.search(rf'<table id="table-{name}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert m, f"no table {name}"
    import html

    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", m.group(1), re.S)]


def assert_self_contained(page: str) -> None:
    """No scripts, and nothing loaded from anywhere: no src/href to a URL, no url(http...), no @import; the only
    URLs are the SVG namespace names."""
    assert "<script" not in page.lower()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*['\"]?\s*(?:https?:)?//", page, re.I)
    assert "@import" not in page and "<link" not in page.lower()
    urls = set(re.findall(r"https?://[^\s\"'<>)]*", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls  # SVG namespaces only


def tputool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The tputool CLI in a subprocess (this checkout first on the path)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tputool", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def render_in_chromium(page: Path, png: Path, tmp: Path, height: int = 2400) -> str:
    """Open `page` in headless Chromium, save a screenshot to `png`; returns the browser's console lines."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (Debian) to run the browser check")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'profile'}", f"--window-size=1200,{height}", "--enable-logging=stderr",
           "--v=0", f"--screenshot={png}", page.resolve().as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
