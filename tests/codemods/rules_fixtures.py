"""Loading the per-rule fixtures of fixtures/rules/ (shared by the rule tests)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")
_EXPECT_UNSAFE = re.compile(r"#\s*expect-unsafe:\s*([A-Z0-9, ]+)")


@dataclass(frozen=True)
class Fixture:
    """One fixture: input, expected safe output, optional expected --unsafe-fixes output."""

    name: str
    source: str
    out: str | None
    unsafe_out: str | None

    @property
    def code(self) -> str:
        return self.name.split("_", 1)[0]

    def expected(self, unsafe: bool = False) -> set[tuple[int, str]]:
        """(line, code) pairs declared by `# expect: CODE[, CODE]` comments of the input.

        With unsafe, also those of `# expect-unsafe: CODE` (findings that appear only once an unsafe fix
        has rewritten a neighbouring node).
        """
        out = set()
        for n, line in enumerate(self.source.splitlines(), 1):
            for rx in (_EXPECT, _EXPECT_UNSAFE) if unsafe else (_EXPECT,):
                m = rx.search(line)
                if m:
                    out |= {(n, c.strip()) for c in m.group(1).split(",") if c.strip()}
        return out


def load_fixtures() -> list[Fixture]:
    """Every fixtures/rules/<CODE>_<name>.in.py with its .out.py / .unsafe.out.py when present."""
    out = []
    for p in sorted(FIXTURES.glob("*.in.py")):
        stem = p.name[: -len(".in.py")]
        o, u = p.with_name(stem + ".out.py"), p.with_name(stem + ".unsafe.out.py")
        out.append(Fixture(stem, p.read_text(), o.read_text() if o.exists() else None,
                           u.read_text() if u.exists() else None))
    return out
