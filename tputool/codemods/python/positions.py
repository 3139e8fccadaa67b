"""Start positions of every node in a module: the `start` of libcst's PositionProvider, computed cheaper.

PositionProvider runs a codegen pass that keeps every token and builds two CodeRange/CodePosition objects
per node. The rewriter only needs where an original node starts, so this pass keeps no tokens and stores a
(line, column) tuple per node; the values are the same as `PositionProvider`'s `start` (checked in
tests/codemods/test_positions.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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

    @contextmanager
    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None,
                                  end_node: cst.CSTNode | None = None) -> Iterator[None]:
        start = (self.line, self.column)
        try:
            yield
        finally:
            self.starts[node] = self.starts[start_node] if start_node is not None else start


def start_positions(module: cst.Module) -> dict[cst.CSTNode, tuple[int, int]]:
    """(1-based line, 0-based column) where each node of `module` starts, as PositionProvider's `start`."""
    state = _StartState(module)
    module._codegen(state)
    return state.starts
