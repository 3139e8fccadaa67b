"""Helpers for the diagnose tests: fixture paths and the `# expect: RULE-NAME` markers in them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "diagnose"
_EXPECT = re.compile(r"#\s*expect:\s*([a-z0-9-]+)")


def expected(path: Path) -> set[tuple[str, int]]:
    """(rule name, line) for every `# expect: NAME` comment in a fixture."""
    out = set()
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            out.add((m.group(1), i))
    return out


def tpu_available() -> bool:
    """True when the bundled tpu device works in this environment (checked in a subprocess, once)."""
    import subprocess
    import sys

    if not hasattr(tpu_available, "cached"):
        r = subprocess.run([sys.executable, "-c", "import torch; torch.ones(2, device='tpu') + 1"],
                           capture_output=True, timeout=120)
        tpu_available.cached = r.returncode == 0
    return tpu_available.cached


@pytest.fixture
def fixture_path():
    return lambda name: FIXTURES / name
