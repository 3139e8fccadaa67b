"""The record -> findings step, on hand-made records (no child process)."""

from __future__ import annotations

import pytest

from tputool.backend.hf_decode import STOP_CHECK
from tputool.diagnose.analyze import classify_recompile, findings_from_record
from tputool.diagnose.model import Report
from tputool.diagnose.record import RunRecord
from tputool.diagnose.report import verdict
from tputool.rules.model import Severity


def _rec(**kw):
    base = {"script": "/u/train.py", "argv": [], "status": "ok", "exit_code": 0, "steps": 10, "devices": ["cpu"]}
    return RunRecord.from_dict({**base, **kw})


def _sync(kind=".item()", device="cpu", direct=True, count=10, steps_seen=10, line=5):
    return {"kind": kind, "file": "/u/train.py", "line": line, "device": device, "direct": direct, "count": count,
            "steps_seen": steps_seen}


@pytest.mark.parametrize("reason, klass", [
    ("0/1: tensor 'x' size mismatch at index 1. expected 8, actual 16", "changing input shapes"),
    ("1/0: s == 1.0                              # return t * s  # x.py:10 in g", "a changing Python scalar"),
    ("2/0: tensor 't' dtype mismatch. expected Float, actual Double", "changing dtype"),
    ("2/0: tensor 't' requires_grad mismatch. expected requires_grad=0", "changing requires_grad"),
    ("3/0: len(L['xs']) == 3", "a changing list/tuple length"),
    ("4/0: something nobody predicted", "another guard failed"),
])
def test_recompile_classes(reason, klass):
    assert classify_recompile(reason)[0] == klass


def test_sync_every_step_is_a_warning_with_rate():
    (f,) = findings_from_record(_rec(host_syncs=[_sync(count=20, steps_seen=10)]))
    assert (f.code, f.severity, f.line, f.per_step) == ("TPU601", Severity.WARNING, 5, 2.0)


def test_one_off_sync_is_info():
    (f,) = findings_from_record(_rec(host_syncs=[_sync(count=1, steps_seen=1)]))
    assert (f.code, f.severity) == ("TPU809", Severity.INFO)


def test_cpu_syncs_dropped_on_device_runs_and_inside_libraries():
    rec = _rec(devices=["cpu", "tpu"], host_syncs=[_sync(device="cpu"), _sync(device="tpu", line=7)])
    assert [f.line for f in findings_from_record(rec)] == [7]
    rec = _rec(host_syncs=[_sync(direct=False), _sync(line=9)])
    assert [f.line for f in findings_from_record(rec)] == [9]


def test_padding_message_and_fraction():
    rec = _rec(shapes=[{"op": "linear", "file": "/u/m.py", "line": 3, "dims": {"M": 8, "K": 100, "N": 128},
                        "count": 4}])
    (f,) = findings_from_record(rec)
    assert f.code == "TPU603" and f.severity == Severity.INFO
    assert "K 100->128" in f.message and f.extra["padding"] == pytest.approx(1 - 100 / 128, abs=1e-3)


def test_recompile_storm_hits_limit():
    compiles = [{"function": "f", "resume_at": None, "file": "/u/t.py", "line": 4, "user": True, "ops": 2,
                 "recompile_reason": None if i == 0 else f"0/{i - 1}: tensor 'x' size mismatch at index 0. "
                 f"expected {i}, actual {i + 1}"} for i in range(8)]
    (f,) = findings_from_record(_rec(compiles=compiles, recompile_limit=8))
    assert f.code == "TPU802" and f.count == 7 and f.extra["hit_limit"]
    assert "recompile limit" in f.message and "mark_dynamic" in f.fix


def test_single_recompile_is_info_and_torch_compiles_ignored():
    compiles = [{"function": "f", "resume_at": None, "file": "/u/t.py", "line": 4, "user": True, "ops": 2,
                 "recompile_reason": r} for r in (None, "0/0: tensor 'x' size mismatch at index 0")]
    compiles.append({**compiles[1], "user": False, "torch": True, "file": "/site-packages/torch/nn/x.py"})
    (f,) = findings_from_record(_rec(compiles=compiles, recompile_limit=8))
    assert f.severity == Severity.INFO and f.path == "/u/t.py"
    lib = [{**c, "user": False, "torch": False, "file": "/site-packages/transformers/m.py"} for c in compiles[:2]]
    assert {f.path for f in findings_from_record(_rec(compiles=compiles[:2] + lib, recompile_limit=8))} == \
        {"/u/t.py", "/site-packages/transformers/m.py"}


def test_backend_events_in_the_loop_and_in_setup():
    mib4 = 4 * 1024 * 1024
    events = [{"kind": "fallback", "detail": "aten::foo", "file": "/u/t.py", "line": 3, "count": 10, "amount": 10,
               "late": 5, "late_amount": 5},
              {"kind": "fallback", "detail": "aten::setup", "file": "/u/t.py", "line": 1, "count": 1, "amount": 1,
               "late": 0, "late_amount": 0},
              {"kind": "transfer_h2d", "detail": "", "file": "/u/t.py", "line": 8, "count": 10,
               "amount": 10 * mib4, "late": 5, "late_amount": 5 * mib4},
              {"kind": "transfer_h2d", "detail": "", "file": "/u/t.py", "line": 2, "count": 4, "amount": 1 << 30,
               "late": 0, "late_amount": 0},
              {"kind": "flush", "detail": "host_sync", "file": "/u/t.py", "line": 9, "count": 10, "amount": 10,
               "late": 5, "late_amount": 5},
              {"kind": "flush", "detail": "optimizer step", "file": "/u/t.py", "line": 11, "count": 10,
               "amount": 10, "late": 5, "late_amount": 5},
              {"kind": "flush", "detail": STOP_CHECK, "file": "/u/t.py", "line": 12, "count": 10,
               "amount": 10, "late": 5, "late_amount": 5},
              {"kind": "host_sync", "detail": STOP_CHECK, "file": "/u/t.py", "line": 12, "count": 10,
               "amount": 10, "late": 5, "late_amount": 5}]
    by = {(f.code, f.line): f for f in findings_from_record(_rec(events=events))}
    assert ("TPU806", 11) not in by  # Fused mode's own step boundary: nothing to remove
    assert ("TPU806", 12) not in by and ("TPU601", 12) not in by  # generate()'s read of whether to stop
    assert by["TPU803", 3].severity == Severity.WARNING and "aten::foo" in by["TPU803", 3].message
    assert by["TPU803", 1].severity == Severity.INFO and "outside the step loop" in by["TPU803", 1].message
    assert "4.0 MiB per step in steady state" in by["TPU807", 8].message
    assert ("TPU807", 2) not in by  # moving the model to the device once is not a finding
    assert by["TPU806", 9].per_step == 1.0


def test_failed_script_points_at_innermost_user_frame_and_verdict():
    err = {"type": "ValueError", "message": "bad", "traceback": [
        {"file": "/u/t.py", "line": 3, "function": "<module>", "text": "f()"},
        {"file": "/u/t.py", "line": 9, "function": "f", "text": "raise ValueError('bad')"}]}
    fs = findings_from_record(_rec(status="error", exit_code=1, error=err))
    assert [(f.code, f.line, f.severity) for f in fs] == [("TPU810", 9, Severity.ERROR)]
    rep = Report("/u/t.py", "error", 1, 0, 1.0, fs, err)
    assert rep.script_failed and verdict(rep).startswith("The script failed: ValueError: bad")


def test_verdict_counts_problems():
    fs = findings_from_record(_rec(host_syncs=[_sync(), _sync(line=6, count=1, steps_seen=1)]))
    rep = Report("/u/train.py", "ok", 0, 10, 1.0, fs)
    assert verdict(rep).startswith("1 problem slows this script on TPU: host sync inside the step loop")
    assert verdict(Report("/u/train.py", "ok", 0, 10, 1.0, [])) == "No problems found that slow this script on TPU."


def test_periodic_logging_sync_is_only_a_note():
    (f,) = findings_from_record(_rec(steps=200, host_syncs=[_sync(count=4, steps_seen=4)]))
    assert (f.code, f.severity) == ("TPU809", Severity.INFO) and "periodic" in f.message


def test_compiles_after_warmup_are_flagged_and_warmup_compiles_are_not():
    events = [{"kind": "compile", "detail": "aten.add", "file": "/u/t.py", "line": 4, "count": 3, "amount": 3,
               "late": 0, "first_step": 0},
              {"kind": "compile", "detail": "graph_3", "file": "/u/t.py", "line": 9, "count": 10, "amount": 10,
               "late": 5, "first_step": 0}]
    (f,) = findings_from_record(_rec(events=events))
    assert (f.code, f.line, f.count, f.severity) == ("TPU808", 9, 5, Severity.WARNING)
    assert "steps 6-10" in f.message and "graph_3 x5" in f.message


def test_late_compiles_of_a_line_that_ran_once_are_its_warm_up():
    # the loop's line compiled in its first call only; the line after the loop compiled (late) in one iteration
    events = [{"kind": "compile", "detail": "aten.addmm", "file": "/u/t.py", "line": 6, "count": 1, "amount": 1,
               "late": 0, "first_step": 0, "last_step": 0},
              {"kind": "compile", "detail": "aten.sum", "file": "/u/t.py", "line": 7, "count": 1, "amount": 1,
               "late": 1, "first_step": 3, "last_step": 3},
              {"kind": "compile", "detail": "aten._to_copy", "file": "/u/t.py", "line": 7, "count": 1, "amount": 1,
               "late": 1, "first_step": 3, "last_step": 3}]
    rec = _rec(steps=0, loop="calls", calls=3, step_s=[0.5, 0.001, 0.001], events=events,
               xla={"compiles": 3, "compile_s": 0.3, "late_compiles": 2, "late_compile_s": 0.1})
    found = findings_from_record(rec)
    assert [f for f in found if f.severity >= Severity.WARNING] == []
    (t,) = [f for f in found if f.code == "TPU812"]
    assert "ran once" in t.message and "nothing needed" in t.fix
    # the same line compiling again in a later iteration (a new shape) is a recompile
    events[1] = {**events[1], "first_step": 0, "count": 2}
    (f,) = [f for f in findings_from_record(rec) if f.severity >= Severity.WARNING]
    assert (f.code, f.line) == ("TPU808", 7)


def test_checkpoint_copies_once_or_every_n_steps_are_notes_with_their_amortised_rate():
    ev = dict(kind="host_sync", detail="cpu", file="/u/t.py", line=12, late=28, late_amount=28)
    copy = dict(kind="transfer_d2h", detail="", file="/u/t.py", line=12, count=28, amount=28 * 8192)
    once = findings_from_record(_rec(steps=5, events=[{**ev, "count": 28, "amount": 28, "steps_seen": 1}, copy]))
    (f,) = once
    assert (f.code, f.severity, f.extra["periodic"]) == ("TPU809", Severity.INFO, "once")
    assert "once per run" in f.message and "224.0 KiB" in f.message and f.per_step == 5.6
    every = findings_from_record(_rec(steps=100, events=[{**ev, "count": 40, "amount": 40, "steps_seen": 4}]))
    assert [(f.code, f.extra["periodic"]) for f in every] == [("TPU809", "periodic")]
    assert "in 4 of 100 steps (about every 25)" in every[0].message
    # the same copies in every step are a per-step cost
    loop = findings_from_record(_rec(steps=10, events=[{**ev, "count": 20, "amount": 20, "steps_seen": 10}]))
    assert [(f.code, f.severity, f.per_step) for f in loop] == [("TPU601", Severity.WARNING, 2.0)]


@pytest.mark.parametrize("reason, words", [
    ("generic_jump TensorVariable()", "data-dependent control flow"),
    ("Dynamic shape operator: Operator `aten.nonzero.default`'s output shape depends on input Tensor data.",
     "output shape depends on the data"),
    ("Failed to trace builtin operator: Dynamo does not know how to trace builtin operator `print` with argument "
     "types ['str'] (has_kwargs False)", "print/logging"),
    ("something new in a later torch", None),
])
def test_graph_break_reasons_explained(reason, words):
    from tputool.diagnose.analyze import explain_graph_break

    what, fix = explain_graph_break(reason)
    assert (what is None) if words is None else (words in what)
    assert fix


def test_fallback_absorbs_its_own_host_sync_and_copy_back():
    ev = dict(file="/u/t.py", line=13, late=2, late_amount=2)
    events = [{"kind": "fallback", "detail": "ns.op.default", "count": 4, "amount": 4, **ev},
              {"kind": "host_sync", "detail": "fallback", "count": 4, "amount": 4, **ev},
              {"kind": "transfer_h2d", "detail": "", "count": 4, "amount": 4096, **ev}]
    assert [f.code for f in findings_from_record(_rec(steps=4, events=events))] == ["TPU803"]


def test_late_xla_compiles_fold_into_a_shape_recompile():
    compiles = [{"function": "f", "resume_at": None, "file": "/u/t.py", "line": 4, "user": True, "ops": 2,
                 "recompile_reason": None if i == 0 else f"0/{i - 1}: tensor 'x' size mismatch at index 1"}
                for i in range(4)]
    late = dict(kind="compile", count=4, amount=4, late=2, late_amount=2, first_step=0)
    events = [{**late, "detail": "graph4.forward", "file": "/u/t.py", "line": 4},
              {**late, "detail": "graph5.backward", "file": "<unknown>", "line": 0},
              {**late, "detail": "aten.randn.default", "file": "/u/t.py", "line": 9}]
    found = findings_from_record(_rec(steps=4, compiles=compiles, recompile_limit=8, events=events))
    assert [(f.code, f.line, f.severity) for f in found if f.severity >= Severity.WARNING] == \
        [("TPU802", 4, Severity.WARNING)]
    (note,) = [f for f in found if f.code == "TPU808"]
    assert (note.line, note.severity, note.extra["executables"]) == (4, Severity.INFO, {"aten.randn.default": 2})


def test_compile_time_warns_only_for_steady_state_compiles():
    from tputool.diagnose.analyze import steady_step_s

    warm = _rec(steps=4, run_s=4.0, step_s=[2.0, 0.1, 0.1, 0.1],
                xla={"compiles": 10, "compile_s": 1.5, "late_compiles": 0, "late_compile_s": 0.0})
    (f,) = findings_from_record(warm)
    assert (f.code, f.severity, f.line) == ("TPU812", Severity.INFO, 0) and "warm-up" in f.fix
    assert steady_step_s(warm) == 0.1
    hot = _rec(steps=4, run_s=4.0, step_s=[1.0, 1.0, 1.0, 1.0],
               xla={"compiles": 10, "compile_s": 3.0, "late_compiles": 5, "late_compile_s": 1.5})
    (f,) = findings_from_record(hot)
    assert f.severity == Severity.WARNING and "1.5 s (5 compiles) in the second half" in f.message
    assert steady_step_s(_rec(step_s=[1.0])) is None


def test_library_recompiles_merge_at_the_user_call_site():
    def lib(fn, line):
        return [{"function": fn, "resume_at": None, "file": f"/site-packages/hf/{fn}.py", "line": line,
                 "user": False, "torch": False, "ops": 3, "call_site": ["/u/train.py", 9],
                 "recompile_reason": None if i == 0 else f"{line}/{i - 1}: tensor 'ids' size mismatch at index 1"}
                for i in range(4)]
    (f,) = findings_from_record(_rec(compiles=lib("forward", 10) + lib("loss", 20), recompile_limit=8))
    assert (f.code, f.path, f.line, f.count) == ("TPU802", "/u/train.py", 9, 3)
    assert f.message.startswith("forward() in forward.py:10 (and 1 more compiled function) recompiled 3 times")


def test_dynamic_shape_op_in_the_loop_warns_once_is_a_note():
    def dyn(count):
        return {"op": "nonzero", "file": "/u/t.py", "line": 3, "count": count}
    (f,) = findings_from_record(_rec(dynamic_shapes=[dyn(10)]))
    assert (f.code, f.severity) == ("TPU602", Severity.WARNING)
    (f,) = findings_from_record(_rec(dynamic_shapes=[dyn(1)]))
    assert (f.code, f.severity, f.message) == ("TPU602", Severity.INFO, "nonzero has a data-dependent output shape (once)")


def test_break_in_library_code_maps_to_the_compile_call_site():
    from tputool.diagnose.dynamo import _site_of_break

    marks = [(0, ("/u/t.py", 9)), (2, ("/u/t.py", 20))]
    assert [_site_of_break(i, marks) for i in (0, 1, 2, 5)] == [("/u/t.py", 9)] * 2 + [("/u/t.py", 20)] * 2
    assert _site_of_break(0, []) is None
    rec = _rec(graph_breaks=[{"file": "/u/t.py", "line": 9, "reason": "generic_jump TensorVariable()",
                              "function": "forward", "compiles": 1, "count": 1,
                              "in_library": "/site-packages/hf/m.py:703", "ops_before": 5, "ops_after": 1}])
    (f,) = findings_from_record(rec)
    assert f.line == 9 and f.message.startswith("graph break in forward() at m.py:703: data-dependent")


def test_transfer_fix_does_not_tell_to_create_batches_once():
    ev = {"kind": "transfer_h2d", "detail": "", "file": "/u/t.py", "line": 8, "count": 10, "amount": 10 << 20,
          "late": 5, "late_amount": 5 << 20}
    (f,) = findings_from_record(_rec(events=[ev]))
    assert f.code == "TPU807" and "once, outside the loop" not in f.fix and "prefetch" in f.fix


def _compile(i, reason):
    return {"function": "f", "resume_at": None, "file": "/u/t.py", "line": 4, "user": True, "ops": 2,
            "recompile_reason": None if i == 0 else reason}


def test_recompiles_only_while_warming_up_are_a_note():
    """nanochat's compiled AdamW step, called once per parameter shape in the first step: a compile each, none
    later. That is warm-up on any device, not a TPU problem (a note); one in a late step keeps the warning."""
    def run(iterations):
        return [{**_compile(i, f"0/{i - 1}: tensor 'p' rank mismatch. expected 2, actual 1" if i else None),
                 "iteration": it} for i, it in enumerate(iterations)]

    (f,) = findings_from_record(_rec(steps=8, compiles=run([0, 0, 0, 0]), recompile_limit=8))
    assert (f.code, f.severity) == ("TPU802", Severity.INFO) and "all in the first step and none after" in f.message
    (f,) = findings_from_record(_rec(steps=8, compiles=run([0, 0, 1, 5]), recompile_limit=8))
    assert (f.code, f.severity) == ("TPU802", Severity.WARNING) and "none after" not in f.message
    (f,) = findings_from_record(_rec(steps=8, compiles=[{k: v for k, v in c.items() if k != "iteration"}
                                                         for c in run([0, 0, 0, 0])], recompile_limit=8))
    assert f.severity == Severity.WARNING  # (when each compile happened is not known)


def test_train_eval_switch_is_not_a_recompile_problem():
    switch = [_compile(0, None), _compile(1, "0/0: GLOBAL_STATE changed: grad_mode ")]
    assert findings_from_record(_rec(compiles=switch, recompile_limit=8)) == []
    # a shape recompile next to the switch is still reported, counted without the switch
    shapes = [*switch, _compile(2, "0/1: tensor 'x' size mismatch at index 0. expected 8, actual 5"),
              _compile(3, "0/2: tensor 'x' size mismatch at index 0. expected 5, actual 3")]
    (f,) = findings_from_record(_rec(compiles=shapes, recompile_limit=8))
    assert f.code == "TPU802" and f.count == 2 and "changing input shapes" in f.message
    # more variants per mode than train + eval: reported, with advice that is not "nothing needed"
    storm = [_compile(i, "0/0: GLOBAL_STATE changed: grad_mode ") for i in range(4)]
    (f,) = findings_from_record(_rec(compiles=storm, recompile_limit=8))
    assert f.severity == Severity.WARNING and "nothing needed" not in f.fix


def test_compile_share_uses_the_headers_run_time():
    rec = _rec(steps=4, run_s=4.0, step_s=[2.0, 0.1, 0.1, 0.1],
               xla={"compiles": 10, "compile_s": 2.0, "late_compiles": 0, "late_compile_s": 0.0})
    rec.wall_s = 10.0
    (f,) = findings_from_record(rec)
    assert "20% of the 10.0 s run" in f.message
    rep = Report("/u/train.py", "ok", 0, 4, rec.wall_s, [f])
    from tputool.diagnose.report import _run_line

    assert "in 10.0 s" in _run_line(rep)


def test_static_findings_not_seen_at_runtime_are_listed_apart_and_not_counted():
    import io

    from rich.console import Console

    from tputool.diagnose.exits import exit_status
    from tputool.diagnose.model import Finding
    from tputool.diagnose.report import render_text

    static = Finding(path="/u/train.py", line=3, col=0, code="TPU101", message="x.cuda()", severity=Severity.WARNING, name="cuda-method-call", fix="port it",
                     source="static")
    rep = Report("/u/train.py", "ok", 0, 10, 1.0, [static])
    assert verdict(rep) == ("No problems found that slow this script on TPU "
                            "(1 static finding not seen at runtime).")
    assert exit_status(rep) == 0
    out = io.StringIO()
    render_text(rep, Console(file=out, width=200))
    text = out.getvalue()
    assert "STATIC, NOT SEEN AT RUNTIME (1)" in text and "WARNINGS" not in text
    static_only = Report("/u/train.py", "static", 0, 0, None, [static], static_only=True)
    assert verdict(static_only).startswith("1 problem for TPU in this script") and exit_status(static_only) == 1
    rt = findings_from_record(_rec(host_syncs=[_sync()]))
    assert verdict(Report("/u/train.py", "ok", 0, 10, 1.0, [*rt, static])).startswith("1 problem slows")


def _site(compiling, calls, generate=False):
    return {"file": "/u/infer.py", "line": 12, "calls": calls, "generate": generate, "compiling": compiling}


def test_inference_loop_per_shape_compiles_are_found_at_the_call():
    every = [[i, 1, {"x": [i + 1, 64]}] for i in range(6)]
    rec = _rec(steps=0, loop="calls", calls=6, call_sites=[_site(every, 6)],
               xla={"compiles": 6, "compile_s": 1.0, "late_compiles": 3, "late_compile_s": 0.5})
    found = findings_from_record(rec)
    (f,) = [f for f in found if f.severity >= Severity.WARNING]
    assert (f.code, f.path, f.line) == ("TPU808", "/u/infer.py", 12)
    assert "x dim 0 varies (1, 2, 3, 4, 5, 6)" in f.message and "pad x dim 0" in f.fix
    (t,) = [f for f in found if f.code == "TPU812"]
    assert "nothing needed" not in t.fix
    # two buckets, both seen in warm-up: no finding
    buckets = [[0, 1, {"x": [8, 64]}], [1, 1, {"x": [16, 64]}]]
    assert findings_from_record(_rec(steps=0, loop="calls", calls=12, call_sites=[_site(buckets, 12)])) == []
    # a generate loop: the hint is a static cache and bucketing
    gen = [[i, 2, {"input_ids": [1, 4 + i]}] for i in range(6)]
    (f,) = findings_from_record(_rec(steps=0, loop="calls", calls=6, call_sites=[_site(gen, 6, generate=True)]))
    assert "input_ids dim 1 varies" in f.message and "static KV cache" in f.fix and "bucket" in f.fix


def test_calls_that_recompile_with_the_same_input_shapes_blame_kept_state_not_the_input():
    """Whisper's decoder: a 4-token first call, then one token per call, its KV cache grown by torch.cat. Calls
    with an input shape seen before compiled again: padding the input would change nothing."""
    calls = [[0, 3, {"x": [1, 4]}]] + [[i, 1, {"x": [1, 1]}] for i in range(1, 8)]
    flush = {"kind": "flush", "detail": "aten.cat.default (its shapes or constant arguments keep changing here: run "
             "alone)", "file": "/u/model.py", "line": 33, "count": 7, "amount": 0}
    rec = _rec(steps=0, loop="calls", calls=8, call_sites=[_site(calls, 8)], events=[flush])
    (f,) = [f for f in findings_from_record(rec) if f.code == "TPU808"]
    assert "8 of 8 calls here compiled" in f.message and "6 of them with input shapes an earlier call had" in f.message
    assert "aten.cat.default at /u/model.py:33 takes new shapes" in f.message and "one per input shape" not in f.message
    assert "allocate it once at its final size" in f.fix and "pad x" not in f.fix and f.extra["state"]


def test_varying_dims_names_rank_changes_too():
    from tputool.diagnose.analyze import varying_dims

    assert varying_dims([{"x": [2, 3]}, {"x": [2, 3, 1]}]) == [("x", None, [2, 3])]
    assert varying_dims([{"x": [2, 3], "m": [2]}, {"x": [4, 3], "m": [2]}]) == [("x", 0, [2, 4])]


def test_inference_loop_messages_count_model_calls():
    rec = _rec(steps=0, loop="calls", calls=6, host_syncs=[_sync(count=6, steps_seen=6)])
    (f,) = findings_from_record(rec)
    assert (f.code, f.per_step) == ("TPU601", 1.0) and "in 6 of 6 model calls" in f.message


def test_findings_ranked_by_cost_per_step_measured_compile_first():
    from tputool.diagnose import cost
    from tputool.diagnose.report import sort_findings, to_json

    times = [2.0] + [0.08] * 9
    rec = _rec(steps=10, loop="steps", devices=["cpu", "tpu"], step_s=times,
               host_syncs=[_sync(device="tpu", count=10, steps_seen=10)])
    found = findings_from_record(rec)
    compiled = _rec(steps=8, loop="steps", devices=["cpu", "tpu"], step_s=[3.0, 0.5] + [0.02] * 6,
                    compiled_models=[{"cls": "GPT", "file": "/u/train.py", "line": 40}])
    tpu813 = cost.compiled_step(rec, compiled)
    assert (tpu813.code, tpu813.line, tpu813.severity) == ("TPU813", 40, Severity.WARNING)
    assert tpu813.extra["cost_basis"] == "measured" and tpu813.extra["cost_ms"] == pytest.approx(60.0)
    found.append(tpu813)
    cost.attach(found, rec)
    sync = next(f for f in found if f.code == "TPU601")
    assert sync.extra["cost_basis"] == "estimated" and sync.extra["cost_ms"] == pytest.approx(0.1)
    assert [f.code for f in sort_findings(found)][:2] == ["TPU813", "TPU601"]
    rep = Report("/u/train.py", "ok", 0, 10, 1.0, found, loop="steps")
    assert verdict(rep).startswith("2 problems slow this script on TPU: run the step under torch.compile: "
                                   "~80 -> ~20 ms per step, measured (/u/train.py:40); host sync inside the step "
                                   "loop: ~0.1 ms/step, estimated")
    import json

    first = json.loads(to_json(rep))["findings"][0]
    assert (first["code"], first["cost_ms_per_step"], first["cost_basis"]) == ("TPU813", 60.0, "measured")


def test_compiled_step_no_faster_is_a_note_and_a_failed_comparison_is_nothing():
    from tputool.diagnose import cost

    rec = _rec(steps=10, loop="steps", step_s=[1.0] + [0.01] * 9)
    same = _rec(steps=8, step_s=[1.0] + [0.0101] * 7, compiled_models=[{"cls": "M", "file": "/u/t.py", "line": 3}])
    f = cost.compiled_step(rec, same)
    assert f.severity == Severity.INFO and "no gain" in f.message and f.extra["cost_ms"] == 0.0
    failed = _rec(steps=1, status="error", step_s=[1.0], compiled_models=same.compiled_models)
    assert cost.compiled_step(rec, failed) is None
    nothing = _rec(steps=8, step_s=[0.005] * 8)  # no model was compiled: no comparison
    assert cost.compiled_step(rec, nothing) is None


def test_steady_state_recompiles_cost_is_measured_from_late_compile_seconds():
    from tputool.diagnose import cost

    events = [{"kind": "compile", "detail": "aten.add", "file": "/u/t.py", "line": 9, "count": 10, "amount": 10,
               "late": 5, "first_step": 0, "last_step": 9}]
    rec = _rec(steps=10, events=events, step_s=[0.1] * 10,
               xla={"compiles": 10, "compile_s": 2.0, "late_compiles": 5, "late_compile_s": 1.0})
    found = findings_from_record(rec)
    cost.attach(found, rec)
    (f,) = [f for f in found if f.code == "TPU808"]
    assert f.extra["cost_basis"] == "measured" and f.extra["cost_ms"] == pytest.approx(200.0)


def test_an_inference_loops_costs_are_per_call():
    from tputool.diagnose import cost

    rec = _rec(steps=0, loop="calls", calls=10, devices=["tpu"], step_s=[2.0] + [0.08] * 9,
               host_syncs=[_sync(device="tpu", count=10, steps_seen=10)])
    found = findings_from_record(rec)
    cost.attach(found, rec)
    rep = Report("/u/infer.py", "ok", 0, 0, 1.0, found, loop="calls")
    assert ": ~0.1 ms/call, estimated (" in verdict(rep) and "ms/step" not in verdict(rep)
