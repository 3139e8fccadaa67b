"""Start one parity child (`python -m tputool.parity._child`) in its own session and read back its record.

The process handling is diagnose's (`tputool.diagnose.runner`: the whole process group is ended with the
child, at the timeout and on Ctrl-C). A child that wrote no record gets a stand-in record saying how it ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tputool.diagnose.runner import HARD_KILL_GRACE_S, end_group, signal_name, wait_child


def _lost(side: str, script: str, rc: int | None, interrupted: bool) -> dict:
    base = {"side": side, "script": os.path.abspath(script), "entries": [], "replays": [], "steps": 0}
    if interrupted:
        return {**base, "status": "interrupted", "exit_code": 130, "error": None}
    if rc is None:
        return {**base, "status": "timeout", "exit_code": 124, "error": None}
    if rc < 0:
        return {**base, "status": "crashed", "exit_code": 128 - rc,
                "error": {"type": signal_name(-rc), "message": f"the {side} run was killed by {signal_name(-rc)}",
                          "traceback": []}}
    return {**base, "status": "crashed", "exit_code": rc or 1,
            "error": {"type": "exit", "message": f"the {side} run exited with status {rc} without a record",
                      "traceback": []}}


def run_side(side: str, script: str, args: list[str], out: str, *, steps: int, timeout_s: float,
             max_mb: float = 16.0, target: str = "cpu", fp32: bool = False, compare: str | None = None,
             slack: float | None = None, quiet: bool = False, perturb: bool = False,
             host_random: bool = False) -> dict:
    """Run `script args` as the `side` child writing its record to `out`; returns the record (plus wall_s).
    `perturb`: the sensitivity twin (`record.perturb`), whose output nobody needs to read again. `host_random`:
    the child's random ops on tpu draw from the CPU generator (`TPUTOOL_RANDOM=host`), as the reference's do."""
    import torch

    cmd = [sys.executable, "-m", "tputool.parity._child", "--side", side, "--out", out, "--steps", str(steps),
           "--max-mb", str(max_mb), "--target", target]
    if fp32:
        cmd.append("--fp32")
    if compare:
        cmd += ["--compare", compare]
    if slack is not None:
        cmd += ["--slack", str(slack)]
    if perturb:
        cmd.append("--perturb")
    cmd += ["--", script, *args]
    if os.path.exists(out):
        os.unlink(out)
    t0 = time.perf_counter()
    out_to = subprocess.DEVNULL if perturb else (2 if quiet else None)
    env = {**os.environ, "TPUTOOL_RANDOM": "host"} if host_random else None
    proc = subprocess.Popen(cmd, stdout=out_to, stderr=subprocess.DEVNULL if perturb else None,
                            start_new_session=True, env=env)
    try:
        rc, interrupted = wait_child(proc, timeout_s + HARD_KILL_GRACE_S)
    finally:
        end_group(proc)
    wall = time.perf_counter() - t0
    try:
        record = torch.load(out, weights_only=False)
    except (OSError, EOFError, RuntimeError):
        record = _lost(side, script, rc, interrupted)
    if interrupted and record.get("status") not in ("interrupted", "error", "exited"):
        record["status"], record["exit_code"] = "interrupted", 130
    record["wall_s"] = wall
    return record
