"""The persistent compilation cache: a second run of the same script loads its XLA executables from disk.

Two subprocesses run the same torch.compile(backend="tpu") script against one fresh cache directory; the
first must miss and write, the second must hit and not miss (counted from JAX's monitoring events).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, torch
from tputool.backend.graph import install, persistent_cache
install()
f = torch.compile(lambda x, y: (x * 2 + y).sum(0), backend="tpu")
out = f(torch.ones(4, 3), torch.arange(3.0))
assert torch.equal(out, torch.tensor([8.0, 12.0, 16.0])), out
print(json.dumps({"dir": str(persistent_cache.cache_dir()), **persistent_cache.stats}))
"""


def _run(cache: Path) -> dict:
    env = {**os.environ, "TPUTOOL_CACHE_DIR": str(cache), "TPUTOOL_BACKEND": "0", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_persistent_cache(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert first["dir"] == str(tmp_path / "xla")
    assert first.get("misses", 0) >= 1 and first.get("hits", 0) == 0
    assert any((tmp_path / "xla").iterdir())
    second = _run(tmp_path)
    assert second.get("hits", 0) >= 1 and second.get("misses", 0) == 0, second


def test_cache_dir_defaults_under_home(monkeypatch, tmp_path: Path) -> None:
    from tputool.backend.graph import persistent_cache

    monkeypatch.delenv("TPUTOOL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert persistent_cache.cache_dir() == tmp_path / ".cache" / "tputool" / "xla"
