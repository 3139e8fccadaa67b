"""The diagnose child: `python -m tputool.diagnose._child --record OUT.json [...] -- SCRIPT [ARGS...]`.

Runs SCRIPT as `__main__` (runpy) with the observers installed, and whatever happens (normal end, an
exception, SystemExit, --max-steps, the soft --timeout, SIGINT from the parent) writes one JSON record of the observations to
OUT.json for the parent (`tputool.diagnose.runner`): a `tputool.diagnose.record.RunRecord`.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import faulthandler
import json
import os
import runpy
import signal
import sys
import time
import warnings


class SoftTimeout(BaseException):
    """Raised in the main thread when --timeout expires, so the record is still written."""


def _on_alarm(signum: int, frame: object) -> None:
    raise SoftTimeout()


def _events_record(boundaries: list[int], steps: int) -> dict:
    """Backend events (tputool.backend.events), aggregated by kind, detail and user location.

    `boundaries[k]` is how many events were logged when step k+1 ended, so each event's step is known:
    `late` counts the events in the second half of the run (steady state, after warm-up; none after the last step
    ended; compiles: `jaxwatch.late_compile_steps`); `first_step` and `last_step` are the iterations of the first and
    last of them, `steps_seen` how many iterations had one (the tail after the last one only if nothing else),
    `late_iters` the iterations of the late ones.
    """
    events = sys.modules.get("tputool.backend.events")
    if events is None:
        return {"events": [], "event_totals": {}}
    from tputool.diagnose.jaxwatch import late_compile_steps

    late_steps, late_compiles = range(steps // 2, steps) if steps >= 2 else range(0), late_compile_steps(steps)
    agg: dict[tuple, dict] = {}
    seen: dict[tuple, set[int]] = {}
    for i, e in enumerate(events.log):
        key = (e["kind"], e["detail"], e["file"], e["line"])
        a = agg.setdefault(key, {"kind": key[0], "detail": key[1], "file": key[2], "line": key[3],
                                 "count": 0, "amount": 0, "late": 0, "late_amount": 0,
                                 "first_step": None, "last_step": None, "steps_seen": 0, "late_iters": []})
        step = bisect.bisect_right(boundaries, i)
        a["count"] += 1
        a["amount"] += int(e.get("amount", 1))
        a["first_step"] = step if a["first_step"] is None else a["first_step"]
        a["last_step"] = step
        seen.setdefault(key, set()).add(step)
        a["steps_seen"] = len(seen[key]) - (steps in seen[key] and len(seen[key]) > 1)  # (the tail: not a step)
        if step in (late_compiles if key[0] == "compile" else late_steps):
            a["late"] += 1
            a["late_amount"] += int(e.get("amount", 1))
            if not a["late_iters"] or a["late_iters"][-1] != step:
                a["late_iters"].append(step)
    totals: dict[str, int] = {}
    for (kind, _), n in events.counts.items():
        totals[kind] = totals.get(kind, 0) + n
    return {"events": list(agg.values()), "event_totals": totals}


def _deferred() -> bool:
    """Whether the backend defers ops now (Fused mode: programs compile at the next flush)."""
    runtime = sys.modules.get("tputool.backend.runtime")
    return runtime is not None and runtime.STATE.mode is runtime.EagerMode.DEFER_AND_FUSE


def main(argv: list[str] | None = None) -> int:
    """Run the script under observation and write the record; returns 0 unless the record failed."""
    p = argparse.ArgumentParser(prog="tputool.diagnose._child")
    p.add_argument("--record", required=True)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--compile-models", action="store_true", help="run top-level models under torch.compile")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    script = os.path.abspath(ns.script)
    os.environ["TPUTOOL_DIAGNOSE"] = "1"
    t0 = time.perf_counter()

    faulthandler.enable()  # a crash in native code (SIGSEGV, SIGABRT) prints the Python stack to stderr
    import torch  # noqa: F401 - loads the bundled backend before the script runs

    from tputool.diagnose import dynamo
    from tputool.diagnose.calls import CallCounter
    from tputool.diagnose.jaxwatch import JaxWatch
    from tputool.diagnose.observe import Observer, StepCounter, StepLimitReached, wrap_from_numpy
    from tputool.diagnose.record import RunRecord
    from tputool.diagnose.userframes import UserFrames

    frames = UserFrames(os.path.dirname(script))
    steps = StepCounter(ns.max_steps)
    steps.on_step.append(lambda n: dynamo.raise_metrics_limit() if n == 1 else None)
    boundaries: list[int] = []  # len(events.log) at the end of each iteration (step, or call before any step)
    events = sys.modules.get("tputool.backend.events")
    calls = CallCounter(frames, (lambda: events.log) if events is not None else list, _deferred)
    # torch warns that global module hooks fire once more for torch.compile(module): CallCounter expects it
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    jaxwatch = JaxWatch(lambda: steps.iteration)

    def first_step(n: int) -> None:  # optimizer steps replace model calls as the loop's iterations
        if n == 1:
            calls.stop()
            boundaries.clear()
            jaxwatch.spans = [(0, name, secs) for _, name, secs in jaxwatch.spans]

    def call_done(n: int) -> None:
        steps.iteration = n
        if events is not None:
            boundaries.append(len(events.log))

    steps.on_step.insert(0, first_step)
    calls.on_call.append(call_done)
    if events is not None:
        steps.on_step.append(lambda n: boundaries.append(len(events.log)))
    # the backend's launch counter when each step / top-level call ended (per-iteration launches, as step_s)
    step_launches: list[int] = []
    call_launches: list[int] = []
    if events is not None:
        steps.on_step.append(lambda n: step_launches.append(events.launches))
        calls.on_call.append(lambda n: call_launches.append(events.launches))
    observer = Observer(frames, steps)
    jaxwatch.install()
    undo_numpy = wrap_from_numpy(frames, observer)
    call_sites = dynamo.CallSites(frames, lambda: steps.iteration)
    call_sites.install()
    compiler = None
    if ns.compile_models:
        from tputool.diagnose.whatif import ModelCompiler

        compiler = ModelCompiler(frames)
        compiler.install()
    record = RunRecord(script=script, argv=list(ns.args), status="ok", exit_code=0, max_steps=ns.max_steps,
                       timeout_s=ns.timeout)
    sys.argv = [script, *ns.args]
    sys.path.insert(0, os.path.dirname(script))
    if ns.timeout:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, ns.timeout)
    t_start = time.perf_counter()
    launches_at_start = events.launches if events is not None else 0
    steps.install()
    calls.install()
    observer.__enter__()
    try:
        runpy.run_path(script, run_name="__main__")
    except StepLimitReached:
        record.status = "step_limit"
    except (SoftTimeout, KeyboardInterrupt) as e:
        timeout = isinstance(e, SoftTimeout)
        record.status, record.exit_code = ("timeout", 124) if timeout else ("interrupted", 130)
        tb = frames.trim_traceback(e.__traceback__)
        record.stopped_at = [tb[-1]["file"], tb[-1]["line"]] if tb else None
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        record.exit_code = code
        if code != 0:
            record.status = "exited"
            said = "" if isinstance(e.code, int) else f": {e.code}"
            record.error = {"type": "SystemExit", "message": f"the script exited with status {code}{said}",
                            "traceback": frames.trim_traceback(e.__traceback__)}
    except BaseException as e:  # noqa: BLE001 - any failure of the user's script goes into the record
        record.status = "error"
        record.exit_code = 1
        tb = frames.trim_traceback(e.__traceback__)
        if isinstance(e, SyntaxError) and e.filename and frames.is_user(e.filename):
            tb.append({"file": e.filename, "line": e.lineno or 0, "function": "<module>",
                       "text": (e.text or "").strip()})
        record.error = {"type": type(e).__name__, "message": str(e), "traceback": tb}
    finally:
        if ns.timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            observer.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - the script left its own mode on the stack; the record matters more
            record.note = "the script left a TorchFunctionMode active"
        steps.remove()
        calls.remove()
        jaxwatch.remove()
        call_sites.remove()
        undo_numpy()
        if compiler is not None:
            compiler.remove()
            record.compiled_models = compiler.compiled
    t_end = time.perf_counter()
    record.steps, record.run_s, record.startup_s = steps.steps, t_end - t_start, t_start - t0
    ends, marks = steps.step_ends, step_launches
    if not steps.steps and calls.calls:
        record.loop, record.calls, record.call_sites, ends = "calls", calls.calls, calls.to_record(), calls.ends
        marks = call_launches
    elif steps.steps:
        record.loop = "steps"
    record.step_s = [b - a for a, b in zip([t_start, *ends], ends, strict=False)]
    if events is not None:  # (a counter reset by the script itself gives no negative count)
        record.launches = [max(b - a, 0) for a, b in zip([launches_at_start, *marks], marks, strict=False)]
    record.xla = jaxwatch.to_record(steps.iteration)
    observed = {**observer.to_record(), **dynamo.collect(frames, call_sites.sites, call_sites.break_marks,
                                                           call_sites.started_in),
                **_events_record(boundaries, steps.iteration)}
    record = dataclasses.replace(record, **observed)  # a TypeError here: an observer's key is not a RunRecord field
    with open(ns.record, "w") as f:
        json.dump(record.to_dict(), f, default=str)  # default=str: a stray non-JSON value must not lose the record
    return 0


if __name__ == "__main__":
    sys.exit(main())
