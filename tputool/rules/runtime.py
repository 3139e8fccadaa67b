"""The rules `tputool diagnose` reports: metadata, docs and one-line fixes (data only).

Runtime-only rules have codes TPU8xx. Where `check` has a static lint for the same problem (host syncs in
a loop, data-dependent shapes, non-128 dims: TPU601-603) diagnose reports under check's code and name, with
the runtime evidence (counts per step) and a severity to match. Each rule reuses
`tputool.rules.model.Rule`, so `check` and `diagnose` share one vocabulary. A rule's `doc` says what the run observed, why it costs time on TPU and how to fix it; `FIX` holds the one-line fix
printed under each finding. Codes never change meaning once published.
"""

from __future__ import annotations

from tputool.rules.model import FixSafety, Rule, RuleClass, Severity

_W, _I, _E = Severity.WARNING, Severity.INFO, Severity.ERROR


def _rule(code: str, name: str, message: str, severity: Severity, doc: str, patterns: tuple[int, ...] = ()) -> Rule:
    return Rule(code, name, message, severity, FixSafety.NONE, RuleClass.REVIEW, doc, patterns)


RULES: tuple[Rule, ...] = (
    # Shared with `check` (same code and name as tputool/rules/port.py): here with runtime evidence.
    _rule("TPU601", "host-sync-in-loop", "host sync inside the step loop", _W,
          "`.item()`, `.cpu()`, `.tolist()`, `.numpy()`, printing a tensor, `float(t)`/`int(t)` and\n"
          "`bool(t)` (`if t.any():`) wait for the device to finish and copy the value to the host, which\n"
          "stalls the TPU pipeline each step. Fix: keep the value on device, log every N steps, replace\n"
          "data-dependent branches with torch.where.", (76,)),
    _rule("TPU602", "dynamic-shape-op", "op with a data-dependent output shape", _W,
          "nonzero, unique, masked_select and boolean-mask indexing produce tensors whose shape depends on\n"
          "the data; XLA needs static shapes, so each new size recompiles or syncs the host. Fix: use\n"
          "torch.where with a fixed-size output, or pad to a fixed size.", (77,)),
    _rule("TPU603", "non-128-dim", "matmul/conv dimension pads badly on the MXU", _I,
          "The TPU matrix unit works on 128x128 tiles (8 rows per sublane): a contracting or output\n"
          "dimension that is not a multiple of 128, or a row dimension not a multiple of 8, is padded and the\n"
          "padding is wasted work. Fix: round hidden/head sizes to multiples of 128 and batch sizes to 8.", (78,)),
    # Runtime-only rules.
    _rule("TPU801", "graph-break", "torch.compile graph break", _W,
          "Dynamo could not trace a Python construct (print, a data-dependent branch, an unsupported call)\n"
          "and split the compiled function in two. Each piece is compiled and launched separately and the\n"
          "values crossing the break go through the host. Fix: remove the construct from the compiled\n"
          "region (log outside it, use torch.where/torch.cond instead of `if tensor:`).", (77,)),
    _rule("TPU802", "recompile", "torch.compile recompiles", _W,
          "A compiled function was compiled again because a guard failed: a new input shape, a changed\n"
          "Python scalar, dtype or requires_grad. Every XLA compile takes seconds; past the recompile limit\n"
          "Dynamo runs the function eagerly. Fix: pad shapes to a few buckets, mark the dimension dynamic\n"
          "(torch._dynamo.mark_dynamic), or pass changing scalars as tensors.", (77,)),
    _rule("TPU803", "cpu-fallback", "op ran on CPU (not lowered to XLA)", _W,
          "The tpu backend has no lowering for this ATen op, so it copied the inputs to the host, ran the op\n"
          "on CPU and copied the result back. Fix: rewrite it with supported ops, or register a lowering.", ()),
    _rule("TPU804", "float64", "float64 tensors on TPU", _W,
          "TPUs have no float64 arithmetic: float64 tensors are emulated or rejected and double the memory\n"
          "traffic. Common sources: numpy arrays (float64 by default) through torch.from_numpy, `.double()`,\n"
          "`dtype=torch.float64`. Fix: convert to float32 (or bfloat16) at the source.", (37,)),
    _rule("TPU805", "float16", "float16 tensors on TPU", _W,
          "TPUs compute in bfloat16, not IEEE float16; float16 is unsupported or converted. Fix: use\n"
          "torch.bfloat16 (`torch.autocast('tpu', dtype=torch.bfloat16)`), which needs no loss scaling.", (36,)),
    _rule("TPU806", "eager-flush", "fused eager flushed its pending ops", _I,
          "Fused eager mode collects ops and compiles them as one XLA program; something forced it to run\n"
          "early (a host sync, a CPU fallback, a print). Frequent flushes mean small programs. Fix: remove the\n"
          "cause named in the message, or compile the step with torch.compile(backend='tpu').", ()),
    _rule("TPU807", "host-to-device", "host-to-device transfers", _I,
          "Bytes copied from the host to the TPU per step. Input batches are expected and cost time only when\n"
          "the step waits for them; tensors created on the CPU and moved each step (torch.tensor(...).to('tpu')\n"
          "in the loop) are not. Fix: prefetch the next batch to the device while the current step runs; create\n"
          "tensors that are the same every step directly on the device (device='tpu').", ()),
    _rule("TPU808", "xla-compile-in-loop", "XLA keeps compiling after warm-up", _W,
          "The backend compiled new XLA executables in the second half of the run, when every shape should\n"
          "have been seen already: inputs change shape (or dtype) from step to step, so each step pays a\n"
          "compile. Fix: pad inputs to a few fixed sizes (buckets); drop the last partial batch. When calls\n"
          "with input shapes seen before compile again, a tensor the calls keep grows (a KV cache extended\n"
          "with torch.cat): allocate it once at its final size and write into it in place.", (77,)),
    _rule("TPU812", "xla-compile-time", "XLA compile time", _I,
          "Seconds JAX spent compiling XLA programs (from jax.monitoring), and how much of it fell in the\n"
          "second half of the run. Warm-up compiles are paid once (the persistent cache saves them next\n"
          "time); compiles in steady state are paid every step. Fix: stable shapes and dtypes, fewer\n"
          "distinct programs (compile the whole step).", (77,)),
    _rule("TPU813", "eager-step", "run the step under torch.compile", _W,
          "In eager mode every op of the step is its own XLA program, dispatched from the host one by one;\n"
          "a step of many small ops costs host time per op. Under torch.compile(backend='tpu') the forward\n"
          "and backward are one program each. diagnose measures the difference: it runs the script again for\n"
          "a few steps with its top-level models compiled and compares the steady-state step times. Fix:\n"
          "`model = torch.compile(model, backend='tpu')` once the model is built.", ()),
    _rule("TPU809", "host-sync", "one-off or periodic host sync", _I,
          "A host sync outside the step loop (once, or at the end) or only every few steps (periodic\n"
          "logging): harmless for speed, listed so the every-step syncs stand out.", (76,)),
    _rule("TPU810", "script-failed", "the script raised an exception", _E,
          "The script stopped with an uncaught exception; the traceback is trimmed to your own frames.\n"
          "Findings above are what was observed until then.", ()),
    _rule("TPU811", "timeout", "the script ran past --timeout", _W,
          "The run was stopped after --timeout seconds; the report covers what ran until then. Fix: pass\n"
          "--max-steps N to stop after N optimizer steps, or a larger --timeout.", ()),
)

FIX: dict[str, str] = {
    "TPU601": "keep the value on the device and read it every N steps (e.g. `if step % 100 == 0:`)",
    "TPU602": "replace it with a fixed-shape op (torch.where, padding to a fixed size)",
    "TPU603": "round this dimension up to a multiple of 128 (rows: of 8)",
    "TPU801": "move the construct out of the compiled function (log outside it; torch.where/torch.cond for branches)",
    "TPU802": "pad the changing dimension to a few fixed buckets, or torch._dynamo.mark_dynamic(x, dim)",
    "TPU803": "rewrite with ops the tpu backend lowers, or move this op out of the step",
    "TPU804": "convert to float32/bfloat16 where the data enters (e.g. torch.from_numpy(a).float())",
    "TPU805": "use torch.bfloat16 instead of torch.float16",
    "TPU806": "remove the flush cause, or compile the step with torch.compile(backend='tpu')",
    "TPU807": "input batches must be copied: prefetch the next batch to the device while this step runs; "
              "create tensors that are the same every step (masks, position ids) with device='tpu' instead",
    "TPU808": "pad the inputs to a few fixed shapes (buckets), e.g. DataLoader(drop_last=True)",
    "TPU812": "keep shapes and dtypes fixed after warm-up; compile the whole step with torch.compile(backend='tpu')",
    "TPU809": "nothing needed: a sync once or every few steps costs little",
    "TPU813": "compile the model once it is built: model = torch.compile(model, backend='tpu')",
    "TPU810": "fix the exception shown in the traceback",
    "TPU811": "pass --max-steps N, or a larger --timeout",
}

BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}

