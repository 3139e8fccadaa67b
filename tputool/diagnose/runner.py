"""Run a script under the diagnose child process and read back its record (`tputool.diagnose.record.RunRecord`,
written as JSON by `tputool.diagnose._child`).

The child runs in its own session (process group), so whatever the script starts (fork, subprocess) is
ended with it: the whole group gets SIGTERM, then SIGKILL after `TERM_GRACE_S`, when the child ends, at the
hard timeout and on Ctrl-C (which is first passed on to the child as SIGINT so that it still writes its record).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from tputool.diagnose.record import RunRecord
from tputool.errors import UserError

HARD_KILL_GRACE_S = 30.0  # past --timeout, how long the child may take to write its record before it is killed
INTERRUPT_GRACE_S = 10.0  # after Ctrl-C, how long the child may take to write its record
TERM_GRACE_S = 2.0  # between SIGTERM and SIGKILL for the child's process group


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def end_group(proc: subprocess.Popen) -> None:
    """End every process of the child's group: SIGTERM, then SIGKILL after TERM_GRACE_S; reaps the child."""
    pgid = proc.pid  # start_new_session: the child leads its own group
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.02)
        else:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait()


def wait_child(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, bool]:
    """The child's return code (None when it outlived `timeout_s`) and whether the user pressed Ctrl-C."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        return None, False
    except KeyboardInterrupt:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=INTERRUPT_GRACE_S), True
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            return None, True


def _lost(script: str, args: list[str], rc: int | None, interrupted: bool, timeout_s: float,
          max_steps: int | None) -> RunRecord:
    """The record of a child that ended without writing one."""
    base = {"script": os.path.abspath(script), "argv": args, "steps": 0, "max_steps": max_steps, "timeout_s": timeout_s}
    if interrupted:
        return RunRecord(status="interrupted", exit_code=130, **base)
    if rc is None:
        return RunRecord(status="timeout", exit_code=124, **base)
    if rc < 0:
        name = signal_name(-rc)
        return RunRecord(status="crashed", exit_code=128 - rc, signal=name, **base,
                         error={"type": name, "message": f"the script was killed by signal {name} ({-rc})",
                                "traceback": []})
    return RunRecord(status="crashed", exit_code=rc, **base,
                     error={"type": "exit", "message": f"the script exited with status {rc} without unwinding "
                            "(os._exit or a fatal error)", "traceback": []})


def signal_name(n: int) -> str:
    """A signal's name (SIGSEGV), or 'signal N' for an unknown number."""
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def run_child(script: str, args: list[str], timeout_s: float, max_steps: int | None,
              script_output_to_stderr: bool = False, compile_models: bool = False, quiet: bool = False) -> RunRecord:
    """Run `script args` in a child interpreter under observation; returns the record plus wall_s.
    With `compile_models`, the script's top-level models run under torch.compile (`tputool.diagnose.whatif`);
    `quiet` discards the script's output."""
    if not os.path.isfile(script):
        raise UserError(f"no such script: {script}")
    fd, record_path = tempfile.mkstemp(prefix="tputool-diagnose-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "tputool.diagnose._child", "--record", record_path, "--timeout", str(timeout_s)]
    if max_steps is not None:
        cmd += ["--max-steps", str(max_steps)]
    if compile_models:
        cmd += ["--compile-models"]
    cmd += ["--", script, *args]
    env = dict(os.environ, TPUTOOL_DIAGNOSE="1")
    t0 = time.perf_counter()
    try:
        out = subprocess.DEVNULL if quiet else (2 if script_output_to_stderr else None)
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL if quiet else None,
                                start_new_session=True)
        try:
            rc, interrupted = wait_child(proc, timeout_s + HARD_KILL_GRACE_S)
        finally:
            end_group(proc)
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
        record = _lost(script, args, rc, interrupted, timeout_s, max_steps)
    elif interrupted and record.status not in ("interrupted", "error", "exited"):
        record.status, record.exit_code = "interrupted", 130
    record.wall_s = wall
    return record
