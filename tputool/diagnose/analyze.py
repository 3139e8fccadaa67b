"""Turn the child's record (raw observations) into findings: severity, code, user file:line, message, fix."""

from __future__ import annotations

import math
import os
import re

from tputool.diagnose.jaxwatch import late_compile_steps
from tputool.diagnose.model import Finding
from tputool.diagnose.record import RunRecord
from tputool.diagnose.report import display_path
from tputool.diagnose.rules import (
    DIM_MULTIPLE,
    GRAPH_BREAK_HINTS,
    MODE_SWITCH,
    MODE_VARIANTS,
    RECOMPILE_HINTS,
)
from tputool.rules.model import Severity
from tputool.rules.runtime import BY_CODE, FIX

RECOMPILE_CLASSES = tuple((re.compile(p), klass, fix) for p, klass, fix in RECOMPILE_HINTS)
_COMPILE_ID = re.compile(r"^\s*\[?\d+/\d+\]?:\s*")


def classify_recompile(reason: str) -> tuple[str, str]:
    """The class of a recompile reason ("changing input shapes", ...) and the fix for it."""
    text = _COMPILE_ID.sub("", reason.split("\n", 1)[0]).strip()
    for pattern, klass, fix in RECOMPILE_CLASSES:
        if pattern.search(text):
            return klass, fix
    return "another guard failed", FIX["TPU802"]


def _finding(code: str, file: str, line: int, message: str, *, count: int = 1, steps: int = 0,
             severity: Severity | None = None, fix: str | None = None, per_step: float | None = None,
             **extra: object) -> Finding:
    """A runtime finding; per_step is count/steps unless given."""
    rule = BY_CODE[code]
    if per_step is None and steps:
        per_step = round(count / steps, 2)
    return Finding(path=file, line=line, col=0, code=code, message=message, severity=severity or rule.severity,
                   extra=dict(extra), name=rule.name, fix=fix or FIX[code], count=count, per_step=per_step,
                   source="runtime")


# A sync seen in at least this fraction of the optimizer steps is "every step"; rarer repeated syncs are
# periodic logging (the recommended pattern) and only a note.
EVERY_STEP_FRACTION = 0.25


def _sync_class(count: int, steps_seen: int, steps: int) -> str:
    """"loop" (in most steps), "periodic" (repeated, in few steps) or "once"."""
    if steps >= 2:
        if steps_seen >= 2 and steps_seen >= EVERY_STEP_FRACTION * steps:
            return "loop"
        return "periodic" if steps_seen >= 2 else "once"
    return "loop" if count >= 2 else "once"


def _device_run(rec: RunRecord) -> bool:
    """Whether the script ran on an accelerator (not on the CPU as a stand-in): CPU tensors then cost it nothing."""
    return any(d not in ("cpu", "meta") for d in rec.devices)


def _host_syncs(rec: RunRecord, steps: int) -> list[Finding]:
    device_run = _device_run(rec)
    out, seen = [], set()
    for s in rec.host_syncs:
        if s["device"] == "cpu" and (device_run or not s.get("direct", True)):
            continue  # syncs of CPU tensors cost nothing on a tpu run, nor inside libraries on a CPU stand-in run
        seen.add((s["file"], s["line"]))
        klass = _sync_class(s["count"], s["steps_seen"], steps)
        if klass == "loop":
            during = f" in {s['steps_seen']} of {steps} {_unit(rec)}" if steps else ""
            out.append(_finding("TPU601", s["file"], s["line"],
                                f"{s['kind']} waits for the device and copies to the host ({s['count']} times{during})",
                                count=s["count"], steps=steps, kind=s["kind"]))
        else:
            how = (f"in {s['steps_seen']} of {steps} {_unit(rec)} (periodic, fine)" if klass == "periodic"
                   else "once (outside the loop)")
            out.append(_finding("TPU809", s["file"], s["line"], f"{s['kind']} syncs the host {how}",
                                count=s["count"], kind=s["kind"]))
    # A CPU fallback reads its inputs back to the host: that sync is part of the fallback finding.
    seen |= {(e["file"], e["line"]) for e in rec.events if e["kind"] == "fallback"}
    d2h = {}
    for e in rec.events:
        if e["kind"] == "transfer_d2h":
            d2h[(e["file"], e["line"])] = d2h.get((e["file"], e["line"]), 0) + e["amount"]
    for e in rec.events:
        if (e["kind"] != "host_sync" or (e["file"], e["line"]) in seen or e["count"] < 2
                or e["detail"] in DESIGNED_FLUSHES):  # (generate()'s stop check: its loop reads it every token)
            continue
        what = f"host sync ({e['detail'] or 'device read'})"
        n, seen_in = e["count"], e.get("steps_seen")
        klass = "loop" if seen_in is None else _sync_class(n, seen_in, steps)
        if klass == "loop":
            out.append(_finding("TPU601", e["file"], e["line"], f"{what}, {n} times", count=n, steps=steps,
                                kind=e["detail"]))
            continue
        # A checkpoint save or a periodic log: copies that come once per run or every few steps, whose cost
        # spread over the run's steps is small; the per-step figure is that amortised one.
        size = d2h.get((e["file"], e["line"]), 0)
        copied = f" ({_bytes(size)})" if size else ""
        if klass == "once":
            how = f"{n} copies{copied} in one {_unit(rec)[:-1]} (once per run)"
        else:
            how = f"{n} copies{copied} in {seen_in} of {steps} {_unit(rec)} (about every {steps // seen_in})"
        amortised = f"; amortised {n / steps:.2g} copies/{_unit(rec)[:-1]}" if steps else ""
        out.append(_finding("TPU809", e["file"], e["line"], f"{what}: {how}{amortised}", count=n, steps=steps,
                            kind=e["detail"], periodic=klass, bytes=size,
                            fix="nothing needed: copies once per run or every few steps cost little per step"))
    return out


def _dtypes(rec: RunRecord, steps: int) -> list[Finding]:
    out = []
    device_run = _device_run(rec)
    for d in rec.dtypes:
        if device_run and d.get("device", "cpu") == "cpu":
            continue  # (float64 kept on the host costs the TPU nothing: it counts where it moves to the device)
        code = "TPU804" if d["dtype"] == "float64" else "TPU805"
        what = (f"moves {d['dtype']} tensors to the device" if d["op"] == "to" and d.get("device", "cpu") != "cpu"
                else f"creates {d['dtype']} tensors")
        out.append(_finding(code, d["file"], d["line"], f"{d['op']} {what} ({d['count']} times)",
                            count=d["count"], steps=steps, op=d["op"]))
    for d in rec.dynamic_shapes:
        repeated = d["count"] >= 2 and (steps < 2 or d["count"] >= EVERY_STEP_FRACTION * steps)
        out.append(_finding("TPU602", d["file"], d["line"], f"{d['op']} has a data-dependent output shape "
                            f"({_times(d['count'])})", count=d["count"], steps=steps, op=d["op"],
                            severity=None if repeated else Severity.INFO))
    return out


def _padded(dims: dict) -> tuple[list[str], float]:
    """Which dims pad (as 'K 100->128') and the fraction of the padded matmul that is padding."""
    parts, real, padded = [], 1, 1
    for d, v in dims.items():
        m = DIM_MULTIPLE[d]
        p = max(m, math.ceil(v / m) * m)
        real, padded = real * v, padded * p
        if v % m:
            parts.append(f"{d} {v}->{p}")
    return parts, 1 - real / padded if padded else 0.0


def _shapes(rec: RunRecord, steps: int) -> list[Finding]:
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for s in rec.shapes:
        groups.setdefault((s["op"], s["file"], s["line"]), []).append(s)
    out = []
    for (op, file, line), items in groups.items():
        items.sort(key=lambda s: -s["count"])
        top = items[0]
        pads, waste = _padded(top["dims"])
        dims = ", ".join(f"{k}={v}" for k, v in top["dims"].items())
        more = f" (+{len(items) - 1} other shapes)" if len(items) > 1 else ""
        count = sum(s["count"] for s in items)
        out.append(_finding("TPU603", file, line, f"{op} {dims}{more}: pads {', '.join(pads)}, "
                            f"{waste:.0%} of the MXU work is padding", count=count, steps=steps, op=op,
                            dims=top["dims"], padding=round(waste, 3)))
    return out


_HINTS = tuple((re.compile(p), what, fix) for p, what, fix in GRAPH_BREAK_HINTS)


def explain_graph_break(reason: str) -> tuple[str | None, str]:
    """What a Dynamo graph-break reason means in plain words (None when unknown) and the fix for it."""
    for pattern, what, fix in _HINTS:
        if pattern.search(reason):
            return what, fix
    return None, FIX["TPU801"]


def _graph_breaks(rec: RunRecord, steps: int) -> list[Finding]:
    out = []
    for b in rec.graph_breaks:
        what, fix = explain_graph_break(b["reason"])
        split = ""
        if b.get("ops_before") is not None or b.get("ops_after") is not None:
            split = f"; splits {b['function']}() into graphs of {b.get('ops_before') or 0} and " \
                    f"{b.get('ops_after') or 0} ops"
        head = f"{what} ({b['reason']})" if what else b["reason"]
        inside = f" at {os.path.basename(b['in_library'])}" if b.get("in_library") else ""
        out.append(_finding("TPU801", b["file"], b["line"], f"graph break in {b['function']}(){inside}: {head}{split}",
                            count=b["compiles"], fix=fix, reason=b["reason"], in_library=b.get("in_library"), ops_before=b.get("ops_before"),
                            ops_after=b.get("ops_after")))
    return out


def _recompiles(rec: RunRecord) -> list[Finding]:
    """One finding per compiled function that recompiled, classified by the guard that failed.

    A library function the user compiled (a Hugging Face forward, say) is reported at the user's call
    site when Dynamo's compile-start callback saw one; functions recompiling for the same reason at the
    same place are one finding.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in rec.compiles:
        if c.get("user") or not c.get("torch", True):  # the user's code, or a library the user compiled
            groups.setdefault((c["file"], c["function"]), []).append(c)
    limit = rec.recompile_limit
    merged: dict[tuple[str, int, str], dict] = {}
    for (file, function), cs in groups.items():
        recompiles = [c for c in cs if c.get("recompile_reason")]
        if not recompiles:
            continue
        classes: dict[str, tuple[int, str, str]] = {}
        for c in recompiles:
            klass, fix = classify_recompile(c["recompile_reason"])
            n, _, example = classes.get(klass, (0, fix, c["recompile_reason"]))
            classes[klass] = (n + 1, fix, example)
        switches = classes.get(MODE_SWITCH, (0,))[0]
        if switches and switches < MODE_VARIANTS:  # one variant per mode: expected, not a problem
            recompiles = [c for c in recompiles if classify_recompile(c["recompile_reason"])[0] != MODE_SWITCH]
            del classes[MODE_SWITCH]
            if not recompiles:
                continue
        elif switches:
            classes[MODE_SWITCH] = (switches, "call it the same way in each mode (eval under torch.no_grad(), "
                                    "the same autocast): more than one variant per mode recompiles",
                                    classes[MODE_SWITCH][2])
        main_class, (_, fix, example) = max(classes.items(), key=lambda kv: kv[1][0])
        line = min(c["line"] for c in cs if c["resume_at"] is None) if any(c["resume_at"] is None for c in cs) \
            else cs[0]["line"]
        where = (file, line)
        sites = [c["call_site"] for c in recompiles if c.get("call_site")]
        if not any(c.get("user") for c in cs) and sites:
            where = (sites[0][0], sites[0][1])
        n = len(recompiles)
        hit = limit is not None and max(sum(1 for c in cs if c["resume_at"] == r) for r in
                                        {c["resume_at"] for c in cs}) >= limit
        entry = merged.setdefault((*where, main_class), {"functions": [], "n": 0, "hit": False, "fix": fix,
                                                         "example": example, "classes": {}})
        entry["functions"].append(f"{function}()" if where == (file, line)
                                  else f"{function}() in {os.path.basename(file)}:{line}")
        entry["n"] = max(entry["n"], n)
        entry["hit"] = entry["hit"] or hit
        entry.setdefault("iterations", []).extend(c.get("iteration") for c in recompiles)
        for k, v in classes.items():
            entry["classes"][k] = entry["classes"].get(k, 0) + v[0]
    out = []
    for (file, line, main_class), e in merged.items():
        guard = _COMPILE_ID.sub("", e["example"].split("\n", 1)[0]).strip()
        name, others = e["functions"][0], e["functions"][1:]
        more = f" (and {len(others)} more compiled function{'s' * (len(others) != 1)})" if others else ""
        n = e["n"]
        msg = f"{name}{more} recompiled {n} time{'s' * (n != 1)}, {main_class} (guard: {guard})"
        if e["hit"]:
            msg += f"; hit the recompile limit ({limit}), so it now runs uncompiled"
        warm_up = _warm_up_only(e["iterations"], iterations(rec), _unit(rec)[:-1])
        if warm_up is not None and not e["hit"]:
            msg += f", all in {warm_up} and none after: warm-up, as on any device"
        out.append(_finding("TPU802", file, line, msg, count=n, fix=e["fix"],
                            severity=Severity.WARNING if (n >= 2 or e["hit"]) and warm_up is None else Severity.INFO,
                            classes=e["classes"], hit_limit=e["hit"], functions=e["functions"]))
    return out


def _warm_up_only(started_in: list[int | None], steps: int, unit: str) -> str | None:
    """Where recompiles that all started before the late iterations (`late_compile_steps`) happened ("the first
    step"); None when one came later, or when that is not known."""
    late = late_compile_steps(steps)
    if not started_in or None in started_in or not len(late) or any(i >= late.start for i in started_in):
        return None
    last = max(started_in)
    return f"the first {unit}" if last == 0 else f"the first {last + 1} {unit}s"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _events(rec: RunRecord, steps: int) -> list[Finding]:
    """CPU fallbacks, fused-eager flushes and host-to-device copies from the backend's event log.

    With two or more steps, what happened only in the first half (set-up, warm-up) is a note at most, and
    per-step figures come from the second half (steady state), where every step should look alike.
    """
    out = []
    steady = steps - steps // 2 if steps >= 2 else 0
    groups: dict[tuple[str, str, str, int], list[int]] = {}
    for e in rec.events:
        if e["kind"] in ("fallback", "flush", "transfer_h2d"):
            g = groups.setdefault((e["kind"], e["detail"], e["file"], e["line"]), [0, 0, 0, 0])
            g[0] += e["count"]
            g[1] += e["amount"]
            g[2] += e.get("late", 0)
            g[3] += e.get("late_amount", 0)
    fallback_at = {(file, line) for kind, _, file, line in groups if kind == "fallback"}
    for (kind, detail, file, line), (n, amount, late, late_amount) in groups.items():
        if kind == "transfer_h2d" and (file, line) in fallback_at:
            continue  # the copy back of a fallback's result: part of the fallback finding
        in_loop = late > 0 if steady else n >= 2
        rate = {"count": n, "per_step": round(late / steady, 2) if steady else (round(n / steps, 2) if steps else None)}
        if kind == "fallback":
            where = "in the step loop" if in_loop else "outside the step loop"
            custom = not detail.startswith(("aten.", "aten::", "prims."))  # a torch.library op: row 62
            out.append(_finding("TPU803", file, line, f"{detail} ran on the CPU {_times(n)} ({where})", **rate,
                                severity=None if in_loop else Severity.INFO, op=detail,
                                **({"patterns": [62]} if custom else {})))
        elif kind == "flush":
            if detail in DESIGNED_FLUSHES:
                continue
            out.append(_finding("TPU806", file, line, f"fused eager flushed: {detail} ({_times(n)})", **rate,
                                reason=detail))
        elif in_loop:
            per = f"{_bytes(late_amount / steady)} per step in steady state, " if steady else ""
            out.append(_finding("TPU807", file, line, f"copies {per}{_bytes(amount)} in all to the device "
                                f"({n} transfers)", **rate, bytes=amount))
    out.extend(_late_compiles(rec, steps))
    return out


def _compile_site(e: dict) -> tuple[str, int]:
    """The user location a compile event is grouped by. Generated code (FX graphs run eagerly:
    "<eval_with_key>.N") and the autograd thread ("<unknown>") have no line of the user's: one group for all."""
    return (e["file"], e["line"]) if not e["file"].startswith("<") else ("<generated code>", 0)


def _late_compile_iters(rec: RunRecord) -> dict[tuple[str, int], set[int] | None]:
    """Per user location, the iterations of the second half in which it compiled (None: a record without them)."""
    out: dict[tuple[str, int], set[int] | None] = {}
    for e in rec.events:
        if e["kind"] != "compile" or not e.get("late"):
            continue
        where = _compile_site(e)
        iters = e.get("late_iters")
        if iters is None or (where in out and out[where] is None):
            out[where] = None
        else:
            out.setdefault(where, set()).update(iters)
    return out


def _late_compile_groups(rec: RunRecord) -> tuple[dict[tuple[str, int], dict[str, int]], int]:
    """Late XLA compiles (second half of the run) by user location and executable, at locations that compiled
    in two or more iterations; and how many late compiles were at locations that compiled in one iteration only.

    A location whose compiles all fall in one iteration ran its ops once (a line after the loop, say): that
    is its own warm-up, not a recompile, however late it came.
    """
    groups: dict[tuple[str, int], dict[str, int]] = {}
    span: dict[tuple[str, int], set[int]] = {}
    for e in rec.events:
        if e["kind"] != "compile":
            continue
        where = _compile_site(e)
        first, last = e.get("first_step"), e.get("last_step")
        iters = span.setdefault(where, set())
        iters.update((-1, -2) if first is None or last is None else (first, last))  # unknown: assume spread
        if e.get("late"):
            g = groups.setdefault(where, {})
            g[e["detail"]] = g.get(e["detail"], 0) + e["late"]
    once = sum(sum(g.values()) for where, g in groups.items() if len(span[where]) < 2)
    return {where: g for where, g in groups.items() if len(span[where]) >= 2}, once


DESIGNED_FLUSHES = frozenset({"optimizer step", "compiled graph input", "generate() stop check", "repeated step"})
"""Fused flush reasons that are the mode's own boundaries, not causes to remove (so no TPU806): every
`optimizer.step()` ends the step's program, a torch.compile'd graph's inputs are computed before it runs, and
`generate()` reads whether to stop after every token (`backend/hf_decode.STOP_CHECK`, also that read's
host-sync reason: no TPU601 either, Hugging Face's loop needs it as it does on CUDA)."""


def _late_compiles(rec: RunRecord, steps: int) -> list[Finding]:
    """TPU808 at each location that keeps compiling XLA programs in the second half of the run."""
    out = []
    iters = _late_compile_iters(rec)
    for (file, line), by_name in _late_compile_groups(rec)[0].items():
        late = sum(by_name.values())
        names = ", ".join(f"{k} x{v}" for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:3])
        window = late_compile_steps(steps)
        message = (f"{late} XLA compiles in the second half of the run ({_unit(rec)} {window.start + 1}-"
                   f"{window.stop}): {names}")
        once = iters.get((file, line))
        if once is not None and len(once) == 1:  # (one step's new programs: an evaluation, an epoch's first step)
            (it,) = once
            out.append(_finding("TPU808", file, line, f"{message}, all in {_unit(rec)[:-1]} {it + 1}: new programs "
                                "of one step (an evaluation, an epoch's first step), not a recompile every step",
                                count=late, steps=len(window), executables=by_name, severity=Severity.INFO,
                                fix="nothing needed unless it repeats: run more steps (--max-steps) to tell"))
            continue
        out.append(_finding("TPU808", file, line, message, count=late, steps=len(window), executables=by_name))
    return out


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# Signals that mean a crash in native code -> how to find where; others -> what usually sends them.
_SIGNAL_FIX = {
    "SIGSEGV": "a crash in native code (a C extension or the runtime): run `python -X faulthandler SCRIPT` "
               "(diagnose's stderr already shows the Python stack) and report it with that stack",
    "SIGKILL": "killed from outside: often the out-of-memory killer (check `dmesg`); lower the batch size",
}
_SIGNAL_FIX["SIGABRT"] = _SIGNAL_FIX["SIGBUS"] = _SIGNAL_FIX["SIGFPE"] = _SIGNAL_FIX["SIGSEGV"]


def _run_status(rec: RunRecord) -> list[Finding]:
    out = []
    err = rec.error
    if rec.status in ("error", "exited", "crashed") and err:
        tb = err.get("traceback") or []
        file, line = (tb[-1]["file"], tb[-1]["line"]) if tb else (rec.script, 0)
        first = (err.get("message") or "").strip().split("\n", 1)[0]
        if rec.status == "exited":
            out.append(_finding("TPU810", file, line, first, fix="the script chose to exit (sys.exit) with "
                                f"status {rec.exit_code}; its own output says why", exit_code=rec.exit_code))
        elif rec.status == "crashed":
            fix = _SIGNAL_FIX.get(rec.signal or "", "see the script's output above for why it ended")
            out.append(_finding("TPU810", file, line, first, fix=fix, exit_code=rec.exit_code, signal=rec.signal))
        else:
            out.append(_finding("TPU810", file, line, f"{err['type']}: {first}".strip().rstrip(":")))
    if rec.status == "timeout":
        file, line = rec.stopped_at or (rec.script, 0)
        at = f", at line {line}" if rec.stopped_at else ""
        out.append(_finding("TPU811", file, line, f"stopped after {rec.timeout_s or 0:g} s{at} ({iterations(rec)} {_unit(rec)} ran)"))
    return out


# Steady-state compile seconds above this fraction of the steady-state step time make TPU812 a warning.
LATE_COMPILE_FRACTION = 0.25


def steady_step_s(rec: RunRecord) -> float | None:
    """Median seconds per optimizer step over the second half of the run (None with fewer than 2 steps)."""
    times = rec.step_s
    late = sorted(times[len(times) // 2:]) if len(times) >= 2 else []
    return late[len(late) // 2] if late else None


def steady_launches(rec: RunRecord) -> int | None:
    """Median device programs launched per iteration over the second half of the run (as `steady_step_s`);
    None with fewer than 2 iterations or a run that did not use the tpu device."""
    counts = rec.launches or []
    late = sorted(counts[len(counts) // 2:]) if len(counts) >= 2 and "tpu" in rec.devices else []
    return late[len(late) // 2] if late else None


def first_step_compiles(rec: RunRecord) -> int | None:
    """XLA compiles before the first iteration (step, or model call) ended; None when no iteration ended or the
    run did not use the tpu device."""
    if not (rec.step_s and "tpu" in rec.devices):
        return None
    return int(rec.xla.get("first_step_compiles", 0))


def _compile_time(rec: RunRecord) -> list[Finding]:
    xla = rec.xla
    total = xla.get("compile_s", 0.0)
    if not xla.get("compiles"):
        return []
    times = rec.step_s
    window = late_compile_steps(len(times))
    late_time = sum(times[window.start:window.stop])
    late = xla.get("late_compile_s", 0.0)
    run = rec.wall_s or rec.run_s or 0.0  # the run time the report's header shows
    share = f" ({total / run:.0%} of the {run:.1f} s run)" if run else ""
    msg = f"XLA compiled {xla['compiles']} programs in {total:.1f} s{share}"
    if window:
        msg += f"; {late:.1f} s ({xla.get('late_compiles', 0)} compiles) in the second half of the run"
    recurring, once = _late_compile_groups(rec)
    first_runs = once > 0 and not recurring  # every late compile was a line's first (and only) run
    bad = late_time > 0 and late > LATE_COMPILE_FRACTION * late_time and not first_runs
    if first_runs:
        msg += ", each at a line that ran once"
    fix = None if late > 0 and not first_runs else \
        "nothing needed: warm-up compiles only (the persistent cache saves them next run)"
    return [_finding("TPU812", rec.script, 0, msg, count=xla["compiles"], fix=fix,
                     severity=Severity.WARNING if bad else Severity.INFO, compile_s=round(total, 3),
                     late_compile_s=round(late, 3))]


def _unit(rec: RunRecord) -> str:
    """What the loop's iterations are called in messages."""
    return "model calls" if rec.loop == "calls" else "steps"


def iterations(rec: RunRecord) -> int:
    """The loop's iterations: optimizer steps, or top-level model calls when no optimizer step ran."""
    return int(rec.steps or 0) or (int(rec.calls or 0) if rec.loop == "calls" else 0)


def findings_from_record(rec: RunRecord) -> list[Finding]:
    """Every runtime finding the record supports, unsorted."""
    steps = iterations(rec)
    found = [*_run_status(rec), *_host_syncs(rec, steps), *_dtypes(rec, steps), *_shapes(rec, steps),
             *_graph_breaks(rec, steps), *_recompiles(rec), *_events(rec, steps), *_compile_time(rec),
             *per_shape_compiles(rec)]
    return _fold_xla_compiles(found)


# A call site whose calls compiled new programs this many times after its first call, some of them in the
# second half of its calls, recompiles per shape (TPU808 at that line); fewer is warm-up (buckets).
PER_SHAPE_MIN_RECOMPILES = 2


def varying_dims(shapes: list[dict[str, list[int]]]) -> list[tuple[str, int | None, list[int]]]:
    """(input name, dimension (None: the rank varies), the values seen in order) for each varying dimension."""
    out = []
    for name in dict.fromkeys(k for s in shapes for k in s):
        seen = [s[name] for s in shapes if name in s]
        if len({len(x) for x in seen}) > 1:
            out.append((name, None, [len(x) for x in seen]))
            continue
        for d in range(len(seen[0])):
            values = [x[d] for x in seen]
            if len(set(values)) > 1:
                out.append((name, d, list(dict.fromkeys(values))))
    return out


def _dims_text(dims: list[tuple[str, int | None, list[int]]]) -> str:
    def vals(v: list[int]) -> str:
        return ", ".join(map(str, v[:8])) + (", ..." if len(v) > 8 else "")
    return "; ".join(f"{name} rank varies ({vals(v)})" if d is None else f"{name} dim {d} varies ({vals(v)})"
                     for name, d, v in dims)


RESHAPING = "its shapes or constant arguments keep changing here"
"""Fused mode's flush reason for an op whose shapes differ at each run (fused.py)."""


def _reshaping_ops(rec: RunRecord) -> list[tuple[str, int, str]]:
    """(file, line, op) of the ops Fused mode saw take new shapes at each run, the most frequent first."""
    seen: dict[tuple[str, int, str], int] = {}
    for e in rec.events:
        if e["kind"] == "flush" and RESHAPING in e["detail"]:
            key = (e["file"], e["line"], e["detail"].split(" (")[0])
            seen[key] = seen.get(key, 0) + e["count"]
    return sorted(seen, key=lambda k: -seen[k])


def _repeated_shapes(shapes: list[dict[str, list[int]]]) -> int:
    """How many of these compiling calls' input shapes an earlier compiling call already had."""
    seen: set[str] = set()
    repeats = 0
    for s in shapes:
        key = repr(sorted(s.items()))
        repeats += key in seen
        seen.add(key)
    return repeats


def per_shape_compiles(rec: RunRecord) -> list[Finding]:
    """Call sites of a loop without an optimizer whose calls keep compiling XLA programs, one per new input
    shape, into the second half of their calls: TPU808 at the calling line, naming the varying dimension."""
    if rec.loop != "calls":
        return []
    out = []
    for site in rec.call_sites:
        n = site["calls"]
        compiling = site["compiling"]
        again = [c for c in compiling if c[0] > 0]
        late = [c for c in again if c[0] >= n // 2]
        if len(again) < PER_SHAPE_MIN_RECOMPILES or not late:
            continue
        dims = varying_dims([c[2] for c in compiling])
        programs = sum(c[1] for c in compiling)
        repeats = _repeated_shapes([c[2] for c in compiling])
        state = repeats >= max(PER_SHAPE_MIN_RECOMPILES, len(again) // 2) and not site.get("generate")
        if state:  # most recompiling calls had input shapes an earlier call compiled for: not the inputs' doing
            grown = _reshaping_ops(rec)
            why = (f"{repeats} of them with input shapes an earlier call had: a tensor the calls keep changes shape" +
                   (f" ({grown[0][2]} at {display_path(grown[0][0])}:{grown[0][1]} takes new shapes each call)"
                    if grown else ""))
            fix = ("state kept between calls grows (a KV cache extended with torch.cat): allocate it once at its "
                   "final size and write each call's part in place (slice assignment or index_copy_), masking "
                   "what is not written yet, so that every call runs the same shapes")
        else:
            why = "one per input shape: " + (_dims_text(dims) or "the same input shapes (another input changes)")
            if site.get("generate"):
                fix = ("each generated token has a new sequence length: use a static KV cache "
                       "(generate(..., cache_implementation='static')) and pad prompts to a few bucket lengths "
                       "(tokenizer(..., padding='max_length') or pad_to_multiple_of=64)")
            else:
                first = next((f"{name} dim {d}" for name, d, _ in dims if d is not None), "the varying dimension")
                fix = (f"pad {first} to a few fixed sizes (buckets: multiples of 64, or powers of 2) before the "
                       "call, or drop the last partial batch (drop_last=True)")
        out.append(_finding("TPU808", site["file"], site["line"],
                            f"{len(compiling)} of {n} calls here compiled new XLA programs ({programs} in all, "
                            f"{len(late)} in the second half of the calls), {why}",
                            count=len(compiling), fix=fix, per_step=round(len(compiling) / n, 2) if n else None,
                            per_shape=True, varying=[{"input": k, "dim": d, "values": v} for k, d, v in dims],
                            generate=bool(site.get("generate")), state=state))
    return out


_GRAPH_EXECUTABLE = re.compile(r"^graph\d*\.(forward|backward)$|^graph")


def _fold_xla_compiles(found: list[Finding]) -> list[Finding]:
    """When Dynamo recompiles for changing shapes (TPU802), late XLA compiles (TPU808) are the same cause:
    those of compiled graphs are dropped, those of eager ops kept as notes pointing at the recompile."""
    out = _fold_late_compiles(found)
    causes = sorted((f for f in out if f.code in ("TPU802", "TPU808") and f.severity >= Severity.WARNING),
                    key=lambda f: not f.extra.get("per_shape"))
    for f in out:
        if f.code == "TPU812" and causes and (f.severity >= Severity.WARNING or f.extra.get("late_compile_s")):
            f.severity = Severity.INFO  # the cost of the recompiles already reported
            f.message += f" (see {causes[0].code} at {os.path.basename(causes[0].path)}:{causes[0].line})"
    return out


def _fold_late_compiles(found: list[Finding]) -> list[Finding]:
    shape_recompiles = [f for f in found if f.code == "TPU802" and f.severity >= Severity.WARNING
                        and "changing input shapes" in f.extra.get("classes", {})]
    shape_recompiles += [f for f in found if f.extra.get("per_shape")]
    if not shape_recompiles:
        return found
    first = shape_recompiles[0]
    eager: dict[str, int] = {}
    for f in found:
        if f.code == "TPU808" and not f.extra.get("per_shape"):
            for k, v in f.extra.get("executables", {}).items():
                if not _GRAPH_EXECUTABLE.match(k):
                    eager[k] = eager.get(k, 0) + v
    out = [f for f in found if f.code != "TPU808" or f.extra.get("per_shape")]
    if eager:
        n = sum(eager.values())
        top = ", ".join(f"{k} x{v}" for k, v in sorted(eager.items(), key=lambda kv: -kv[1])[:3])
        out.append(_finding("TPU808", first.path, first.line, f"{n} XLA compiles of eager ops in the second half "
                            f"of the run, from the same changing shapes: {top}", count=n,
                            severity=Severity.INFO, executables=eager))
    return out

