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


# What the fixtures need from the tpu device: eager training steps (SGD, AdamW), float64 copies, and
# torch.compile(backend="tpu"). Run once per test session in a subprocess.
_PROBE = """
import numpy as np, torch
m = torch.nn.Linear(8, 8).to("tpu")
for opt in (torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.AdamW(m.parameters())):
    m(torch.randn(2, 8, device="tpu")).pow(2).mean().backward(); opt.step(); opt.zero_grad()
torch.from_numpy(np.zeros((2, 8))).to("tpu").sum().item()
f = torch.compile(lambda x: m(x).sum(), backend="tpu")
f(torch.randn(2, 8, device="tpu")).item()
"""


def tpu_works() -> bool:
    """True when the bundled tpu device and its compile backend run what the fixtures need."""
    import subprocess
    import sys

    if not hasattr(tpu_works, "cached"):
        try:
            r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=180)
            tpu_works.cached = r.returncode == 0
        except subprocess.TimeoutExpired:
            tpu_works.cached = False
    return tpu_works.cached


@pytest.fixture(params=["cpu", "tpu"])
def device(request, monkeypatch):
    """Run the fixture scripts on this device (TPUTOOL_FIXTURE_DEVICE); tpu only where it works."""
    if request.param == "tpu" and not tpu_works():
        pytest.skip("the tpu device cannot run the fixtures in this build")
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", request.param)
    return request.param
