"""Start positions of every node in a module: the `start` of libcst's PositionProvider, computed cheaper.

PositionProvider runs a codegen pass that keeps every token and builds two CodeRange/CodePosition objects
per node. The rewriter only needs where an original node starts, so this pass keeps no tokens and stores a
(line, column) tuple per node; the values are the same as `PositionProvider`'s `start` (checked in
tests/codemods/test_positions.py).
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.internal import CodegenState


class _StartState(CodegenState):
    """A codegen state that tracks the current (line, column) and records each node's start."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.line = 1  # one-based
        self.column = 0  # zero-based
        self.starts: dict[cst.CSTNode, tuple[int, int]] = {}

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        # Same line breaks as PositionProvider: \r\n, \r and \n each end one line.
        lines = value.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.line += len(lines) - 1
        self.column = len(lines[-1])

    def before_codegen(self, node: cst.CSTNode) -> None:
        # A start recorded by record_syntactic_position (inside this node's codegen) replaces this one.
        if node not in self.starts:
            self.starts[node] = (self.line, self.column)

    def after_codegen(self, node: cst.CSTNode) -> None:
        pass

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> _Syntactic:
        return _Syntactic(self, node, start_node)


class _Syntactic:
    """The context manager of record_syntactic_position: a node's start without its leading whitespace."""

    __slots__ = ("state", "node", "start_node", "start")

    def __init__(self, state: _StartState, node: cst.CSTNode, start_node: cst.CSTNode | None) -> None:
        self.state, self.node, self.start_node = state, node, start_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> None:
        starts = self.state.starts
        starts[self.node] = starts[self.start_node] if self.start_node is not None else self.start


def start_positions(module: cst.Module) -> dict[cst.CSTNode, tuple[int, int]]:
    """(1-based line, 0-based column) where each node of `module` starts, as PositionProvider's `start`."""
    state = _StartState(module)
    module._codegen(state)
    return state.starts
