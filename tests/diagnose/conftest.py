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


# What the fixtures need from the tpu device: eager training steps (SGD, AdamW) and float64 copies; the
# graph-break and recompile fixtures also need torch.compile(backend="tpu"). Each probe runs once, in a
# subprocess.
_PROBE_EAGER = """
import numpy as np, torch
m = torch.nn.Linear(8, 8).to("tpu")
for opt in (torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.AdamW(m.parameters())):
    m(torch.randn(2, 8, device="tpu")).pow(2).mean().backward(); opt.step(); opt.zero_grad()
torch.from_numpy(np.zeros((2, 8))).to("tpu").sum().item()
"""
_PROBE_COMPILE = _PROBE_EAGER + """
f = torch.compile(lambda x: m(x).pow(2).mean(), backend="tpu")
f(torch.randn(2, 8, device="tpu")).backward()
"""
_probed: dict[bool, bool] = {}


def tpu_works(compile: bool = False) -> bool:
    """True when the bundled tpu device (and, with `compile`, its torch.compile backend) runs the fixtures."""
    import subprocess
    import sys

    if compile not in _probed:
        try:
            r = subprocess.run([sys.executable, "-c", _PROBE_COMPILE if compile else _PROBE_EAGER],
                               capture_output=True, timeout=180)
            _probed[compile] = r.returncode == 0
        except subprocess.TimeoutExpired:
            _probed[compile] = False
    return _probed[compile]


@pytest.fixture(params=["cpu", "tpu"])
def device(request, monkeypatch):
    """Run the fixture scripts on this device (TPUTOOL_FIXTURE_DEVICE); a tpu device that fails the probe fails.

    Tests marked `needs_compile` also need torch.compile(backend="tpu") on the tpu device."""
    if request.param == "tpu":
        compile = request.node.get_closest_marker("needs_compile") is not None
        if not tpu_works(compile):
            pytest.fail("the bundled tpu device" + (" compile backend" if compile else "")
                        + " fails the probe script (run tests/backend to see why)")
    else:
        monkeypatch.setenv("TPUTOOL_BACKEND", "0")  # CPU runs need no backend: a faster child start-up
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", request.param)
    return request.param


@pytest.fixture
def no_backend(monkeypatch):
    """Children start without the tpu backend (for tests of CPU-only scripts)."""
    monkeypatch.setenv("TPUTOOL_BACKEND", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_compile: the fixture needs torch.compile(backend='tpu') on tpu")
