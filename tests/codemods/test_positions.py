"""The rewriter's fast paths keep libcst's behaviour: start positions equal PositionProvider's, handler dispatch."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from tests.codemods.rules_fixtures import load_fixtures
from tputool.codemods.python.speed.positions import start_positions

TRICKY = [
    "x = (a +\n     b)  # c\n",
    "@dec\n# comment\n\nclass A(B):\n    def f(self, *, x=1):\n        return [i for i in (x,)]\n",
    "if a:\r\n    b = c.cuda()\r\nelse:\r\n    pass\r\n",
    "s = '''one\ntwo''' + f\"{x!r:>{w}}\"\nt = a[1:2, ...]\n",
    "with (open(p) as f, g() as h):\n    async def k(): await m\n",
    "def f(\n    a,  # first\n    b=lambda: (yield),\n):\n    x: int = 1; y = 2\n",
    "",
    "\n\n# only a comment",
]


def _expected(module: cst.Module) -> dict[cst.CSTNode, tuple[int, int]]:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return {n: (r.start.line, r.start.column) for n, r in wrapper.resolve(PositionProvider).items()}


@pytest.mark.parametrize("source", TRICKY + [fx.source for fx in load_fixtures()])
def test_start_positions_match_position_provider(source: str) -> None:
    module = cst.parse_module(source)
    assert start_positions(module) == _expected(module)


def test_attribute_handlers_are_refused() -> None:
    """PortBase skips libcst's per-field dispatch, so a per-field handler must fail loudly, not be ignored."""
    from tputool.codemods.python.context import PortBase

    with pytest.raises(TypeError, match="visit_Call_func"):
        type("Bad", (PortBase,), {"visit_Call_func": lambda self, node: None})
