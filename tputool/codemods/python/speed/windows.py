"""What the rules read about a whole file, gathered one window at a time (for porting a large file in windows).

A few rules decide on facts of the whole file: its text (does it name the tpu device, an accelerator, float32
buffers), its optional imports, whether it sets a CUDA default tensor type, the names it assigns from a device
value, and the codes already reported once. When port_python rewrites a large file a window at a time (see
__init__.py), `gather()` reads these facts from every window first and `FileFacts.apply()` gives them to each
window's transformer, so a window decides as the whole file would.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst

from tputool.codemods.python.speed.names import ImportIndex


@dataclass
class FileFacts:
    """The file-level facts a transformer would otherwise compute from its own (partial) module."""

    text: str
    float32_buffers: bool
    optional: frozenset[str]
    sets_cuda_default: bool
    device_names: frozenset[str]
    reported_once: set[str] = field(default_factory=set)  # shared by the windows, in file order

    def apply(self, t) -> None:
        """Give these facts to a window's transformer (a PortBase)."""
        t._text = self.text
        t._float32_buffers = self.float32_buffers
        t._optional = self.optional
        t._sets_cuda_default = self.sets_cuda_default
        t._device_names = self.device_names
        t.reported_once = self.reported_once


class _Names:
    """Name resolution through the file's import index (an exact one), as a transformer does it."""

    def __init__(self, index: ImportIndex) -> None:
        self.index = index

    def qname(self, node: cst.CSTNode) -> str | None:
        from tputool.codemods.python.context import PortBase

        return PortBase.qname(self, node)  # type: ignore[arg-type]


def gather(source: str, window_texts: Iterable[str], index: ImportIndex) -> FileFacts:
    """The facts of the file `source`, read from the masked text of each of its windows (parsed one at a time)."""
    from tputool.codemods.python.api import sets_cuda_default, stores_float32_buffers
    from tputool.codemods.python.device_flow import device_assigns, names_from_assigns
    from tputool.codemods.python.imports import optional_names

    text = "\n".join(source.splitlines())
    names = _Names(index)
    optional: set[str] = set()
    sets_default = False
    assigns: list = []
    for window in window_texts:
        module = cst.parse_module(window)
        optional |= optional_names(module)
        sets_default = sets_default or sets_cuda_default(names, module)
        assigns += device_assigns(module)
        del module
        gc.collect()
    return FileFacts(text, stores_float32_buffers(text), frozenset(optional), sets_default,
                     names_from_assigns(assigns))
