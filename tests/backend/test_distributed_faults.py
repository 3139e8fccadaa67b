"""Faults of the tpu process group across processes: Ctrl-C on the launcher ends every rank; a rank killed in
the middle of device collectives, or a sender that never sends, is named by the others within the group's
timeout and they exit (status 1) instead of hanging; send/recv tags that differ fail by name on both ranks.

The worker is fixtures/fault_worker.py. The dead-rank tests start the ranks as plain processes with torchrun's
environment (no agent to end the survivors for them, as on another host of a multi-host job)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "fixtures" / "fault_worker.py"
TIMEOUT_S = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
            "WORKER_TIMEOUT": str(TIMEOUT_S), **extra}


def _ranks(mode: str, out: Path, **extra: str) -> list[subprocess.Popen]:
    """Two ranks of `mode` as plain processes (RANK, WORLD_SIZE, MASTER_ADDR/PORT set as torchrun would)."""
    port = str(_free_port())
    procs = []
    for r in range(2):
        env = _env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, **extra)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), mode, str(out)], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def _pids(out: Path, ranks: tuple[int, ...], within: float = 120) -> list[int]:
    """The pids the ranks wrote once running."""
    files = [out / f"rank{r}.pid" for r in ranks]
    end = time.monotonic() + within
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < end, "the workers did not start"
        time.sleep(0.2)
    return [int(f.read_text()) for f in files]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _finish(procs: list[subprocess.Popen]) -> str:
    """Everything the processes printed (any still running is killed first)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    return "".join(p.communicate()[0] for p in procs)


def test_ctrl_c_on_tputool_run_ends_every_rank(tmp_path: Path) -> None:
    """SIGINT to the launcher's process group (a terminal's Ctrl-C) while the ranks all-reduce in a loop."""
    launcher = subprocess.Popen([sys.executable, "-m", "tputool", "run", "--nproc", "2", str(WORKER), "loop",
                                 str(tmp_path)], env=_env(WORKER_NUMEL="1000000"), cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        pids = _pids(tmp_path, (0, 1))
        time.sleep(1)
        os.killpg(launcher.pid, signal.SIGINT)
        end = time.monotonic() + 15
        while (launcher.poll() is None or any(map(_alive, pids))) and time.monotonic() < end:
            time.sleep(0.2)
        left = [p for p in pids if _alive(p)]
        running = launcher.poll() is None
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        out = _finish([launcher])
    assert not running and not left, f"still running 15 s after Ctrl-C: launcher {running}, workers {left}"
    assert launcher.returncode == 128 + signal.SIGINT, out[-3000:]
    assert "tputool run: interrupted (SIGINT)" in out and "SignalException" not in out, out[-3000:]


@pytest.mark.parametrize(("mode", "checks"), [("loop", "1"), ("loop", "0"), ("compiled", "0")])
def test_a_rank_killed_inside_collectives_is_named_and_the_survivor_exits(tmp_path: Path, mode: str,
                                                                           checks: str) -> None:
    """Rank 1 is killed while both all-reduce 16 MB in a loop (with and without the signature exchange; eager,
    or inside a compiled graph run as one program over the group)."""
    procs = _ranks(mode, tmp_path, WORKER_NUMEL=str(4 << 20), TPUTOOL_DIST_CHECKS=checks)
    try:
        _pids(tmp_path, (0, 1))
        time.sleep(1)
        procs[1].kill()
        start = time.monotonic()
        procs[0].wait(timeout=TIMEOUT_S + 30)
        took = time.monotonic() - start
    finally:
        out = _finish(procs)
    m = re.search(r"RANK 0 FAILED after [\d.]+s: (.*)", out)
    assert m, out[-3000:]
    assert re.search(r"tpu process group \(rank 0 of 2\): .*rank\(s\) 1 of 2 (stopped|did not join)", m.group(1)), m.group(1)
    assert procs[0].returncode == 1, out[-3000:]
    assert took < TIMEOUT_S + 15, f"rank 0 took {took:.0f}s to end after rank 1 died"


def test_a_rank_whose_script_raises_ends_at_once_and_is_named_by_the_other(tmp_path: Path) -> None:
    """Rank 1 raises after one all-reduce: it exits (status 1) at once instead of waiting for rank 0 at JAX's
    shutdown barrier (while rank 0 waits for it in the next collective), and rank 0 names it from its stopped
    heartbeat, long before the group's timeout (60 s here)."""
    procs = _ranks("raise", tmp_path, WORKER_TIMEOUT="60")
    ended: dict[int, float] = {}
    try:
        end = time.monotonic() + 180
        while len(ended) < 2 and time.monotonic() < end:
            for r, p in enumerate(procs):
                if r not in ended and p.poll() is not None:
                    ended[r] = time.monotonic()
            time.sleep(0.1)
    finally:
        out = _finish(procs)
    assert "ValueError: a bug in rank 1's script" in out, out[-3000:]
    assert [p.returncode for p in procs] == [1, 1], out[-3000:]
    assert 0 < ended[0] - ended[1] < 20, f"rank 1 ended {ended[0] - ended[1]:.1f}s before rank 0"
    assert re.search(r"RANK 0 FAILED after [\d.]+s: .*rank\(s\) 1 of 2 stopped \(no heartbeat", out), out[-3000:]


def test_a_late_rank_that_is_alive_is_waited_for(tmp_path: Path) -> None:
    """Rank 1 joins an all-reduce 8 s late while its heartbeat goes on: rank 0 waits (the timeout is 60 s) and
    both get the sum (of the first all-reduce's sums: 4)."""
    procs = _ranks("late", tmp_path, WORKER_TIMEOUT="60", WORKER_LATE="8")
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        out = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], out[-3000:]
    waited = re.search(r"RANK 0 OK after ([\d.]+)s: \[4.0, 4.0, 4.0, 4.0\]", out)
    assert waited and float(waited.group(1)) > 5, out[-3000:]


@pytest.mark.parametrize("checks", ["1", "0"])
def test_a_recv_whose_sender_never_sends_fails_within_the_timeout(tmp_path: Path, checks: str) -> None:
    """The second recv of a pair that has already exchanged once (with the checks off: the bounded wait)."""
    procs = _ranks("recv", tmp_path, TPUTOOL_DIST_CHECKS=checks)
    try:
        _pids(tmp_path, (1,))
        start = time.monotonic()
        procs[0].wait(timeout=TIMEOUT_S + 90)
        took = time.monotonic() - start
    finally:
        out = _finish(procs)
    if checks == "1":  # the store exchange names the sender
        m = re.search(r"RANK 0 FAILED after ([\d.]+)s: (.*)", out)
        assert m and re.search(r"recv #2 from rank 1: rank 1 did not send within the timeout", m.group(2)), out[-3000:]
        assert float(m.group(1)) < TIMEOUT_S + 8, m.group(0)
    else:  # XLA:CPU blocks in the dispatch: the watchdog prints the error and ends the process
        assert re.search(r"\[tputool\] tpu process group \(rank 0 of 2\): recv #2 from rank 1: stuck in the "
                         r"runtime past the timeout \(10s\): rank\(s\) 1 of 2 alive", out), out[-3000:]
    assert took < TIMEOUT_S + 15, f"rank 0 took {took:.0f}s"
    assert procs[0].returncode == 1, out[-3000:]


def test_send_recv_tags_must_match(tmp_path: Path) -> None:
    """Equal tags deliver; a send with tag 1 met by a recv with tag 2 fails on both ranks, naming both tags."""
    procs = _ranks("tags", tmp_path, TPUTOOL_DIST_CHECKS="0")  # (a non-zero tag is checked even so)
    try:
        procs[1].wait(timeout=120)
        procs[0].wait(timeout=30)
    finally:
        out = _finish(procs)
    assert "RANK 1 GOT [10.0, 20.0, 30.0]" in out, out[-3000:]
    for r, what in ((0, "send #2 to rank 1"), (1, "recv #2 from rank 0")):
        assert re.search(rf"RANK {r} MISMATCH after [\d.]+s: .*{what} does not match: rank 0 sends float32\[3\] tag 1 "
                         rf"but rank 1 receives float32\[3\] tag 2", out), out[-3000:]
    assert "RANK 1 HOLDS [10.0, 20.0, 30.0]" in out  # (nothing delivered by the mismatched pair)
    assert [p.returncode for p in procs] == [1, 1], out[-3000:]  # (marked failed: no wait at JAX's shutdown)
