"""Render a parity report (text or JSON) and map it to `tputool parity`'s exit status.

JSON schema "tputool.parity/1" (fields are only ever added):
  schema; script; verdict (one line); steps (compared on both sides); loop: steps | calls; slack;
  reference: {source: "run" | the --reference path, device, status, exit_code, error, fp32, records, wall_s};
  tpu: {status, exit_code, error, records, wall_s, matmul_precision, random ("host": its random ops drew from the
  CPU generator, as the reference's; "device": from the tpu's own stream)};
  findings: [{kind: departure | divergence, file, line (the user's line: the first departing op's when the
    op-by-op replay found one), key, module, cls, step, message, causes: [{name, message, file, line, module?, cls?,
    op?, site_file?, site_line?, key?}] (op, site, key: a random op called outside any module whose draw
    differed before the departure),
    op: null | {op, file, line, dtype, ref_dtype, max_abs, max_rel, ulps, needed, fallback},
    growth: [level rows after it in the same step]; module/cls: the module whose code holds `line` (a
    replayed parent of the first departing record's module when its replay located the cause); a departure
    also has seen_in (the first departing record's module), record (in | out | grad),
    module_file, module_line, dtype, ref_dtype, max_abs, max_rel, ulps, explained: {rtol, atol},
    ratio, needed: {atol, rtol, at_rtol, at_atol}, replays: [{key, name, cls, ops, ref_ops}]}];
  levels: [{key, kind, name, cls, step, call, file, line, dtype, max_abs, max_rel, ulps, ratio, beyond,
    explained, needed}] (every record compared, in tpu execution order; ratio: the largest error over its
    allowance atol + rtol * |ref|, above 1 departs, "inf" for a NaN mismatch, null for a shape mismatch); per_step: [{step, records, beyond, max_rel,
    max_abs, needed_atol}]; replay_error: null or why the op-by-op replay failed;
  sensitivity: null, or where a departure the earlier updates brought (cause inherited) was measured against the
    twin run (the reference with its weights changed by one rounding step): {key, step, module, tpu_max_abs,
    twin_max_abs, twin_status, explains}; explained: [the departure, as in findings] when the twin departs within
    a factor `slack` of the tpu run (then findings holds no departure of it: the script amplifies rounding).

Exit status: 0 no departure; 1 a departure (or divergence) beyond tolerance; 2 usage error; the script's own
status when it failed on either side (see tputool/diagnose/exits.py: 124 timeout, 130 interrupted, 128+N).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tputool.diagnose.exits import run_ending
from tputool.diagnose.report import display_path

SCHEMA = "tputool.parity/1"


def exit_status(report: dict) -> int:
    """parity's exit status for `report` (see the module doc)."""
    for side in ("reference", "tpu"):
        run = report[side]
        ending = run_ending(run["status"] or "crashed", run.get("exit_code"))
        if ending is not None:
            return ending
    return 1 if report["findings"] else 0


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _where(file: str, line: int) -> str:
    return f"{display_path(file)}:{line}" if file else "<unknown>"


def verdict(report: dict) -> str:
    """The one-line summary."""
    for side in ("reference", "tpu"):
        run = report[side]
        if run["status"] not in ("ok", "step_limit"):
            err = run.get("error") or {}
            msg = f": {err.get('type')}: {err.get('message')}" if err else ""
            return f"The {side} run ended with status {run['status']}{msg}"
    if not report["findings"] and report.get("explained"):
        sens = report["sensitivity"]
        return (f"No departure beyond this script's own sensitivity: {sens['module']} differs from the reference by "
                f"max abs {_g(sens['tpu_max_abs'])} at step {sens['step']}, and so does the reference itself with its "
                f"weights changed by one rounding step (max abs {_g(sens['twin_max_abs'])}): its training amplifies "
                "rounding, which any device's sets off.")
    if not report["findings"]:
        return (f"No departure: every recorded output and gradient of {report['steps']} step(s) agrees with the "
                "reference within what the dtypes explain.")
    f = report["findings"][0]
    causes = ", ".join(c["name"] for c in f["causes"])
    return f"{f['module']} departs from the reference at {_where(f['file'], f['line'])} ({causes})"


def render_text(report: dict, echo: Callable[[str], None]) -> None:
    """Print the report as text through `echo`."""
    ref = report["reference"]
    echo(f"tputool parity: {display_path(report['script'])}")
    src = "recorded " + display_path(ref["source"]) if ref["source"] != "run" else "run"
    echo(f"  reference: {ref['device']} ({src}{', float32' if ref.get('fp32') else ''}), {ref['records']} records;"
         f" tpu: {report['tpu']['records']} records; {report['steps']} step(s) compared")
    if report["tpu"].get("random") == "host":
        echo("  random ops on tpu drew from the CPU generator, as the reference's (--device-random: the tpu's own)")
    echo("")
    echo(verdict(report))
    for f in report.get("explained", []):
        echo(f"{_where(f['file'], f['line'])}: explained: {f['message']} (cause inherited)")
    for f in report["findings"]:
        echo("")
        echo(f"{_where(f['file'], f['line'])}: {f['kind'].upper()} {f['message']}")
        if f["kind"] == "departure":
            echo(f"  module call: {_where(f['module_file'], f['module_line'])}  {f['key']}  "
                 f"{f['dtype']} (reference {f['ref_dtype']})")
            echo(f"  error: max abs {_g(f['max_abs'])}, max rel {_g(f['max_rel'])}, {_g(f['ulps'])} ULPs; "
                 f"explained up to rtol {_g((f['explained'] or {}).get('rtol'))}, "
                 f"atol {_g((f['explained'] or {}).get('atol'))}")
            n = f.get("needed")
            if n:
                echo(f"  assert_close passes with rtol={_g(n['at_rtol'])}, atol={_g(n['atol'])}  "
                     f"or  rtol={_g(n['rtol'])}, atol={_g(n['at_atol'])}")
        op = f.get("op")
        if op:
            echo(f"  first op: {op['op']} at {_where(op['file'], op['line'])}: max abs {_g(op['max_abs'])}, "
                 f"max rel {_g(op['max_rel'])}, {_g(op['ulps'])} ULPs ({op['dtype']} vs {op['ref_dtype']})")
        for c in f["causes"]:
            echo(f"  cause: {c['name']}: {c['message']} ({_where(c['file'], c['line'])})")
        if f.get("growth"):
            echo("  then: " + "; ".join(f"{g['name']} rel {_g(g['max_rel'])}" for g in f["growth"]))
    if report["per_step"]:
        echo("")
        echo("per step: " + "; ".join(f"step {s['step']}: max rel {_g(s['max_rel'])}, max abs {_g(s['max_abs'])},"
                                      f" {s['beyond']}/{s['records']} beyond, atol needed {_g(s['needed_atol'])}"
                                      for s in report["per_step"]))
    sens = report.get("sensitivity")
    if sens and not sens["explains"]:
        twin = (f"max abs {_g(sens['twin_max_abs'])}" if sens["twin_max_abs"] is not None
                else f"no comparable record (its run: {sens['twin_status']})")
        echo(f"sensitivity: the reference with its weights changed by one rounding step differs by {twin} at "
             f"{sens['key']}: less than the tpu run's {_g(sens['tpu_max_abs'])} by more than the slack")
    if report.get("replay_error"):
        echo(f"note: the op-by-op replay failed: {report['replay_error']}")


def _plain(x):
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return str(x)
    return x


def to_json(report: dict) -> str:
    """The report as JSON (schema tputool.parity/1)."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return _plain(v)

    return json.dumps(clean({"schema": SCHEMA, "verdict": verdict(report), **report}), indent=2, default=str)
