"""`tputool diagnose --target SLICE`: ask the TPU compiler whether the script's first step(s) fit and compile.

The script runs abstractly in a child (`tputool.diagnose.target_run`: tensors without data, every program
recorded and compiled for the slice's compile-only devices); this module runs that child, searches the
largest fitting micro batch when asked (`--batch-arg`), and turns the child's figures into the report's
`"target"` object (`check_target`) and its text (`render_text`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from tputool.errors import UserError

INSTALL_HINT = "--target needs the TPU compiler (libtpu): pip install 'tputool[tpu-compile]'"

LEVERS = (
    ("parameters", "keep parameters in bfloat16 (model.to(torch.bfloat16)) or shard them with FSDP2 over more chips"),
    ("optimizer_state", "shard the optimizer state with FSDP2 (fully_shard) over more chips"),
    ("gradients", "shard gradients with FSDP2; accumulate over smaller micro batches"),
    ("ddp_buckets", "FSDP2 (fully_shard) instead of DDP, whose buckets keep a flat copy of the gradients"),
    ("activations", "recompute activations (torch.utils.checkpoint), a smaller micro batch, or a Pallas "
                    "attention kernel (torch.tpu.ops.splash_sdpa) instead of materialized attention scores"),
)
"""What to do about each kind of memory that does not fit (`levers`: ranked by the bytes of the kind)."""


def levers(memory_by_kind: dict[str, int]) -> list[str]:
    """The levers for the kinds of memory a step holds, the largest kind first, each with its bytes per chip."""
    ranked = sorted((kind for kind, _ in LEVERS if memory_by_kind.get(kind)), key=lambda k: -memory_by_kind[k])
    text = dict(LEVERS)
    return [f"{kind.replace('_', ' ')} ({_gib(memory_by_kind[kind])}): {text[kind]}" for kind in ranked]


def _run_child(script: str, args: list[str], target: str, steps: int, timeout_s: float,
               step_only: bool = False, config: str | None = None) -> dict[str, Any]:
    """One abstract run of `script args` for `target` in a child process; its JSON result plus wall/host figures."""
    from tputool.diagnose.runner import end_group, wait_child

    fd, path = tempfile.mkstemp(prefix="tputool-target-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "tputool.diagnose.target_run", "--record", path, "--target", target,
           "--steps", str(steps), *(["--step-only"] if step_only else []),
           *(["--config", config] if config else []), "--", script, *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, env=dict(os.environ, TPUTOOL_DIAGNOSE="1"), stdout=2,
                                start_new_session=True)
        try:
            rc, _ = wait_child(proc, timeout_s)
        finally:
            end_group(proc)
        with open(path) as f:
            text = f.read()
        rec = json.loads(text) if text else None
    finally:
        os.unlink(path)
    if rec is None:
        rec = _compiler_abort(path + ".progress", rc)
    if rec is None:
        why = "timed out" if rc is None else f"ended with status {rc} without a result"
        rec = {"status": "crashed", "error": {"type": "child", "message": f"the abstract run {why}", "traceback": []}}
    rec["check_seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def _compiler_abort(progress: str, rc: int | None) -> dict[str, Any] | None:
    """The result of a child the TPU compiler aborted (a fatal check, e.g. SIGABRT) while compiling the program
    its progress file names; None when it did not die there."""
    from tputool.diagnose.runner import signal_name
    from tputool.diagnose.target_run import fatal_line

    try:
        with open(progress) as f:
            at = json.load(f)
        with open(progress + ".err", errors="replace") as f:
            log = f.read()
    except (OSError, json.JSONDecodeError):
        return None
    finally:
        for p in (progress, progress + ".err"):
            if os.path.exists(p):
                os.unlink(p)
    why = fatal_line(log) or f"the compiler was killed by {signal_name(-rc) if rc and rc < 0 else rc}"
    failed = [*at.pop("failed"), {**at, "error": f"the TPU compiler aborted: {why}"}]
    return {"status": "compiler_aborted", "failed": failed, "error": None}


def _with_batch(args: list[str], batch_arg: str, batch: int) -> list[str]:
    """`args` with the script's option `batch_arg` (e.g. `--batch_size`) set to `batch`."""
    out, i, found = [], 0, False
    while i < len(args):
        a = args[i]
        if a == batch_arg:
            out += [a, str(batch)]
            i += 2
            found = True
            continue
        if a.startswith(batch_arg + "="):
            out.append(f"{batch_arg}={batch}")
            found = True
        else:
            out.append(a)
        i += 1
    return out if found else [*out, batch_arg, str(batch)]


def _batch_of(args: list[str], batch_arg: str) -> int | None:
    for i, a in enumerate(args):
        if a == batch_arg and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith(batch_arg + "="):
            return int(a.split("=", 1)[1])
    return None


def largest_fitting_batch(script: str, args: list[str], target: str, steps: int, timeout_s: float,
                          batch_arg: str, batch: int, config: str | None = None) -> tuple[int | None, list[dict]]:
    """The largest value of the script's `batch_arg` below `batch` whose step fits (compiled, not guessed):
    halving until one fits, then bisecting; returns it (None when even 1 does not fit) and the tries."""
    tries: list[dict] = []

    def fits(b: int) -> bool:
        rec = _run_child(script, _with_batch(args, batch_arg, b), target, steps, timeout_s, step_only=True,
                         config=config)
        ok = bool(rec.get("fits"))
        tries.append({"batch": b, "fits": ok, "peak_bytes_per_chip": rec.get("peak_bytes_per_chip")})
        return ok

    lo, hi = 0, batch  # lo fits (0: none known), hi does not
    b = batch // 2
    while b >= 1 and not fits(b):
        hi, b = b, b // 2
    if b < 1:
        return None, tries
    lo = b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, tries


def check_target(script: str, args: list[str], target: str, *, steps: int = 1, timeout_s: float = 600.0,
                 batch_arg: str | None = None, calibration: str | None = None,
                 config: str | None = None) -> dict[str, Any]:
    """The report's "target" object for `script args` on slice `target` (see docs/target-check.md); `config`:
    a tputool-tune.yaml applied to the script (its mesh over the slice's chips)."""
    from tputool.tune.cost_model import program_seconds
    from tputool.tune.hardware import tpu_hardware
    from tputool.tune.slices import parse_target
    from tputool.tune.tpu_compile import available

    if not available():
        raise UserError(INSTALL_HINT)
    if not os.path.isfile(script):
        raise UserError(f"no such script: {script}")
    if steps < 1:
        raise UserError("--steps must be at least 1")
    sl = parse_target(target)
    if batch_arg is not None and _batch_of(args, batch_arg) is None:
        raise UserError(f"--batch-arg {batch_arg}: the script's arguments do not set it (pass {batch_arg} N)")
    if config is not None:
        from tputool.tune.config import load_config

        need = load_config(config).candidate.n_devices
        if need > sl.n_devices:
            raise UserError(f"{config}: the tuned mesh needs {need} chips, {sl.name} has {sl.n_devices}")
        config = os.path.abspath(config)
    hw = tpu_hardware(sl, calibration)
    rec = _run_child(os.path.abspath(script), args, target, steps, timeout_s, config=config)
    out: dict[str, Any] = {
        "slice": sl.name, "topology": sl.topology_name, "devices": sl.n_devices,
        "hbm_bytes_per_chip": int(sl.chip.hbm_bytes),
        "status": rec.get("status"), "steps": rec.get("steps", 0), "error": rec.get("error"),
        "peak_bytes_per_chip": rec.get("peak_bytes_per_chip"), "fits": rec.get("fits"),
        "programs": rec.get("programs"), "compile_seconds": rec.get("compile_seconds"),
        "step_compile_seconds": rec.get("step_compile_seconds"), "step_program": rec.get("step_program"),
        "failed": rec.get("failed", []),
        "oom_message": rec.get("oom_message"),
        "live_bytes_per_chip": rec.get("live_bytes", {}), "largest_values": rec.get("largest_values", []),
        "assumptions": rec.get("assumptions", []), "sharding": rec.get("sharding"),
        "check_seconds": rec.get("check_seconds"),
        "check_host_max_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    }
    if rec.get("step_error"):
        out["step_error"] = rec["step_error"]
    world = int(rec.get("world") or 1)
    out["world"] = world
    out["config"] = config
    out["collective_bytes"] = rec.get("collective_bytes", {})
    if rec.get("flops"):
        # the ranks' collectives (DDP's all-reduce) over the slice's ring, as tune's cost model times them
        comm = sum(hw.collective_s({"data": world}, "data", kind, n) for kind, n in out["collective_bytes"].items())
        secs = program_seconds(rec["flops"], rec.get("bytes_accessed", 0.0), hw) + comm
        out["collective_seconds"] = comm
        out["step_seconds"] = secs
        out["flops_per_chip"] = rec["flops"]
        out["mfu"] = rec["flops"] / (secs * hw.matmul_flops["bf16"])
    if out["fits"] is False:
        live = dict(rec.get("live_bytes", {}))
        peak = out["peak_bytes_per_chip"] or 0
        held = sum(v for k, v in live.items() if k != "other")
        live["activations"] = max(0, peak - held - live.get("other", 0))
        out["memory_by_kind"] = live
        out["levers"] = levers(live)
        if batch_arg is not None:
            batch = _batch_of(args, batch_arg)
            best, tries = largest_fitting_batch(os.path.abspath(script), args, target, steps, timeout_s,
                                                batch_arg, batch, config)
            out["largest_fitting_batch"] = best
            out["batch_tries"] = tries
    return out


def _gib(n: float | None) -> str:
    from tputool.tune.search import fmt_bytes

    return "?" if n is None else fmt_bytes(n)


def render_text(t: dict[str, Any]) -> str:
    """The target object as the text report."""
    lines = [f"target {t['slice']} ({t['devices']} devices, {t['topology']}): {_gib(t['hbm_bytes_per_chip'])} HBM per chip"]
    if t.get("error"):
        e = t["error"]
        where = e["traceback"][-1] if e.get("traceback") else None
        at = f" at {where['file']}:{where['line']}" if where else ""
        lines.append(f"  the abstract run failed{at}: {e['type']}: {e['message']}")
    if t.get("fits") is not None:
        verdict = "fits" if t["fits"] else "DOES NOT FIT"
        of = f" ({t['step_program']} as one program)" if t.get("step_program") else ""
        lines.append(f"  peak memory per chip{of}: {_gib(t['peak_bytes_per_chip'])} -> {verdict}")
    if t.get("sharding"):
        mesh = " x ".join(f"{k} {v}" for k, v in t["sharding"]["mesh"].items())
        lines.append(f"  sharded by {t.get('config') or 'the script'}: mesh {mesh}")
    live = t.get("memory_by_kind") or t.get("live_bytes_per_chip") or {}
    if live:
        lines.append("  live at the end of the step: " + ", ".join(f"{k} {_gib(v)}" for k, v in live.items() if v))
    if t.get("fits") is False:
        for v in t.get("largest_values", [])[:3]:
            at = f" ({v['file']}:{v['line']})" if v.get("file") else ""
            lines.append(f"  large value: {v['dtype']}{v['shape']} {_gib(v['bytes'])}{at}")
        if "largest_fitting_batch" in t:
            lines.append(f"  largest micro batch that fits: {t['largest_fitting_batch']}")
        for lever in t.get("levers", []):
            lines.append(f"  lever: {lever}")
    if t.get("programs") is not None:
        lines.append(f"  programs: the step as one program (Fused eager, the default, or torch.compile) compiled for "
                     f"TPU in {t.get('step_compile_seconds') or 0:.1f} s; op by op (Strict eager): {t['programs']} "
                     f"distinct programs, {t['compile_seconds']:.1f} s")
    for f in t.get("failed", []):
        at = f" at {f['file']}:{f['line']}" if f.get("file") else ""
        lines.append(f"  REJECTED by the TPU compiler{at} ({f['program']}): {f['error']}")
    if t.get("step_seconds"):
        lines.append(f"  step time >= {t['step_seconds'] * 1e3:.2f} ms (cost analysis), predicted MFU {t['mfu']:.1%}")
    for a in t.get("assumptions", []):
        lines.append(f"  assumed: {a['reason']} at {a['file']}:{a['line']} read as zeros (no data in the check)")
    lines.append(f"  check: {t['check_seconds']:.1f} s, host memory {_gib(t['check_host_max_rss_bytes'])}")
    return "\n".join(lines)


def exit_status(t: dict[str, Any]) -> int:
    """0: the step fits and every program compiles; 1: it does not fit, a program is rejected, or the run failed."""
    ok = t.get("fits") is True and not t.get("failed") and not t.get("error")
    return 0 if ok else 1
