"""XLA's C++ log lines during compiles, captured at the file-descriptor level and summarised one line per kind.

XLA (and libtpu) write warnings such as "Involuntary full rematerialization" straight to file descriptor 2,
past Python's `sys.stderr`, once per compile: a search compiling dozens of candidates would bury its table.
`XlaLog.capture(who)` points fd 2 at a temporary file around a compile; absl-formatted warning and error
lines (and libtpu's `WARNING: ...` lines) are kept by kind with the candidate `who` that caused them,
everything else is written back to the
real stderr unchanged (informational absl lines are dropped). `summary()` gives one line per kind.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

_ABSL = re.compile(r"^(?P<level>[IWEF])\d{4} [\d:.]+\s+\d+ (?P<where>[\w./-]+:\d+)\] (?P<msg>.*)$")
"""An absl log line: `W1204 17:27:10.123456   4242 hlo_rematerialization.cc:3011] message`."""

_PLAIN = re.compile(r"^(?P<level>WARNING|ERROR): (?P<msg>.*)$")
"""libtpu's own start-up lines: `WARNING: could not determine TPU accelerator type, ...`."""

SHOWN = 3
"""Candidates named per kind in the summary (then `+N more`)."""


def kind_of(message: str) -> str:
    """A warning's kind: its first sentence (or clause), numbers replaced by `N`, at most 80 characters."""
    first = re.split(r"(?<=[a-z)])[.:;](?:\s|$)", message.strip(), maxsplit=1)[0]
    return re.sub(r"\d+(\.\d+)?", "N", first)[:80].rstrip()


@dataclass
class XlaLog:
    """Warnings and errors XLA logged during captured compiles: kind -> candidates, in first-seen order."""

    kinds: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, text: str, who: str) -> str:
        """File the absl warning/error lines of `text` under `who`; returns the other lines (info dropped)."""
        rest = []
        for line in text.splitlines(keepends=True):
            m = _ABSL.match(line.rstrip("\n")) or _PLAIN.match(line.rstrip("\n"))
            if m is None:
                rest.append(line)
                continue
            if m["level"] == "I":
                continue
            kind = kind_of(m["msg"])
            names = self.kinds.setdefault(kind, [])
            if who not in names:
                names.append(who)
            self.counts[kind] = self.counts.get(kind, 0) + 1
        return "".join(rest)

    @contextlib.contextmanager
    def capture(self, who: str, keep_rest: bool = True) -> Iterator[None]:
        """Redirect fd 2 to a temporary file while the block runs (a compile of candidate `who`), then file
        what was written; the other lines are written back unless not `keep_rest` (libtpu's start-up lines)."""
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                rest = self.add(tmp.read().decode("utf-8", "replace"), who)
                if rest and keep_rest:
                    os.write(2, rest.encode())

    def summary(self) -> list[str]:
        """One line per kind: how often, and which candidates caused it."""
        out = []
        for kind, names in self.kinds.items():
            shown = ", ".join(names[:SHOWN]) + (f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else "")
            n = self.counts[kind]
            out.append(f"XLA warning x{n}: {kind} - from {shown}")
        return out
