"""The heartbeat thread (`tputool.backend.distributed.liveness`) is stopped and joined at exit, before the
interpreter finalizes: a daemon thread still inside a store call then is ended by a forced unwind through the
store's C++ frames, and the process aborts ("terminate called without an active exception", status 134) after
the script succeeded (seen in CI on two-process runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import atexit
    import torch.distributed as dist
    from tputool.backend.distributed import liveness

    # registered before the heartbeat starts: runs after liveness's own exit handler
    atexit.register(lambda: print("alive at exit:", liveness._thread.is_alive(), flush=True))
    liveness.start(dist.HashStore(), 0)
    assert liveness._thread.is_alive()
""")


def test_the_heartbeat_thread_has_ended_before_the_interpreter_finalizes():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "alive at exit: False" in r.stdout, r.stdout + r.stderr[-3000:]
