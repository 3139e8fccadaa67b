"""Jupyter notebooks (nbformat 4): the code cells as one Python module for the rewriter, and back.

The code cells are joined in order, each after a marker statement, so names imported in one cell resolve
in the next (as they do in the kernel). IPython lines (`%magic`, `!shell`, `x = !cmd`, `help?`) are
masked by placeholder statements of the same line count and put back after the rewrite; a cell that starts
with a cell magic (`%%bash`) is left out. The notebook is written back with its own JSON layout (indent,
key order, ASCII escaping, final newline) and every other field untouched; when that layout cannot be
reproduced exactly, the notebook is reported but not rewritten.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_MARK = "__tputool_cell_{}__"
_MARK_LINE = re.compile(r"^__tputool_cell_(\d+)__\n", re.MULTILINE)
_MAGIC = re.compile(r"^(\s*)(?:[%!]|\w[\w.,\s]*=\s*[%!]|[^#\n]*\?$)")
_MAGIC_LINE = re.compile(r"^(\s*)__tputool_magic_(\d+)__$", re.MULTILINE)


class NotebookError(ValueError):
    """The notebook is not valid nbformat-4 JSON, or the rewrite cannot be split back into its cells."""


@dataclass
class Notebook:
    """A parsed notebook and the Python module made of its code cells."""

    doc: dict
    layout: tuple[int | None, bool, bool] | None  # (indent, ensure_ascii, final newline); None: not reproducible
    code: str  # the joined, masked module
    cells: list[int]  # indexes (into doc["cells"]) of the cells in `code`, in order
    starts: list[int]  # 1-based line in `code` where each of those cells begins
    magics: list[str]

    def locate(self, line: int) -> tuple[int, int]:
        """(1-based cell number in the notebook, line in that cell) of a line of `code`."""
        k = 0
        for i, start in enumerate(self.starts):
            if start <= line:
                k = i
        return self.cells[k] + 1, max(1, line - self.starts[k] + 1)

    def rebuild(self, new_code: str) -> str:
        """The notebook's JSON text with the code cells replaced by the rewritten `new_code`."""
        if self.layout is None:
            raise NotebookError("its JSON layout cannot be reproduced, so it is not rewritten")
        parts = _MARK_LINE.split(new_code)
        head, rest = parts[0], parts[1:]
        ids = [int(x) for x in rest[0::2]]
        if ids != list(range(len(self.cells))):
            raise NotebookError("the rewrite moved code across cells; not rewritten")
        bodies = [self._unmask(b) for b in rest[1::2]]
        if head.strip():
            bodies[0] = head + bodies[0]
        for index, body in zip(self.cells, bodies, strict=True):
            cell = self.doc["cells"][index]
            old = _source(cell)
            if not old.endswith("\n") and body.endswith("\n"):
                body = body[:-1]
            if body != old:
                cell["source"] = body.splitlines(keepends=True) if isinstance(cell["source"], list) else body
        indent, ensure_ascii, newline = self.layout
        return json.dumps(self.doc, indent=indent, ensure_ascii=ensure_ascii) + ("\n" if newline else "")

    def _unmask(self, text: str) -> str:
        return _MAGIC_LINE.sub(lambda m: self.magics[int(m.group(2))], text)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _layout(text: str, doc: dict) -> tuple[int | None, bool, bool] | None:
    m = re.match(r"\{\n( +)\"", text)
    indent = len(m.group(1)) if m else None
    newline = text.endswith("\n")
    for ensure_ascii in (False, True):
        if json.dumps(doc, indent=indent, ensure_ascii=ensure_ascii) + ("\n" if newline else "") == text:
            return indent, ensure_ascii, newline
    return None


def load(text: str) -> Notebook:
    """Parse a notebook's JSON text; raises NotebookError when it is not an nbformat-4 notebook."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise NotebookError(f"invalid notebook JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise NotebookError("not a Jupyter notebook (no cells list)")
    magics: list[str] = []

    def mask(ln: str) -> str:
        m = _MAGIC.match(ln)
        if m is None:
            return ln
        magics.append(ln)
        return f"{m.group(1)}__tputool_magic_{len(magics) - 1}__"

    chunks, cells, starts, line = [], [], [], 1
    for index, cell in enumerate(doc["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = _source(cell)
        if src.lstrip().startswith("%%"):
            continue
        body = "\n".join(mask(ln) for ln in src.split("\n"))
        if not body.endswith("\n"):
            body += "\n"
        chunks.append(_MARK.format(len(cells)) + "\n" + body)
        cells.append(index)
        starts.append(line + 1)
        line += 1 + body.count("\n")
    return Notebook(doc, _layout(text, doc), "".join(chunks), cells, starts, magics)
