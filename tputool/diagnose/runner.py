"""Run a script under the diagnose child process and read back its record (`tputool.diagnose.record.RunRecord`,
written as JSON by `tputool.diagnose._child`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from tputool.diagnose.record import RunRecord
from tputool.errors import UserError

HARD_KILL_GRACE_S = 30.0


def run_child(script: str, args: list[str], timeout_s: float, max_steps: int | None,
              script_output_to_stderr: bool = False) -> RunRecord:
    """Run `script args` in a child interpreter under observation; returns the record plus wall_s."""
    if not os.path.isfile(script):
        raise UserError(f"no such script: {script}")
    fd, record_path = tempfile.mkstemp(prefix="tputool-diagnose-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "tputool.diagnose._child", "--record", record_path, "--timeout", str(timeout_s)]
    if max_steps is not None:
        cmd += ["--max-steps", str(max_steps)]
    cmd += ["--", script, *args]
    env = dict(os.environ, TPUTOOL_DIAGNOSE="1")
    t0 = time.perf_counter()
    try:
        try:
            proc = subprocess.run(cmd, env=env, stdout=2 if script_output_to_stderr else None,
                                  timeout=timeout_s + HARD_KILL_GRACE_S)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
        wall = time.perf_counter() - t0
        try:
            with open(record_path) as f:
                text = f.read()
            record = RunRecord.from_dict(json.loads(text)) if text else None
        except (OSError, json.JSONDecodeError):
            record = None
    finally:
        try:
            os.unlink(record_path)
        except OSError:
            pass
    if record is None:
        why = "was killed after the timeout" if rc is None else f"exited with status {rc} before writing a record"
        record = RunRecord(script=os.path.abspath(script), argv=args,
                           status="crashed" if rc is not None else "timeout", exit_code=rc if rc is not None else 1,
                           error={"type": "ChildCrashed", "message": f"the diagnose child {why}", "traceback": []},
                           steps=0, max_steps=max_steps, timeout_s=timeout_s)
    record.wall_s = wall
    return record
