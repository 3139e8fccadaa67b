"""Data of `tputool diagnose`'s analysis: matmul dimension multiples and the hint tables for Dynamo's
graph-break reasons and recompile guards. The rules themselves live in `tputool.rules.runtime`."""

from __future__ import annotations

# Matmul dimension -> the multiple it should be (TPU603): K (contracting), N (output) and head_dim feed the
# 128-wide MXU; M (rows) fills 8-row sublanes.
DIM_MULTIPLE: dict[str, int] = {"M": 8, "K": 128, "N": 128, "head_dim": 128}

# Dynamo graph-break reasons (regex on the reason text) -> (what it means, the fix). First match wins.
GRAPH_BREAK_HINTS: tuple[tuple[str, str, str], ...] = (
    (r"generic_jump|[Dd]ata-dependent branching|data dependent operator",
     "data-dependent control flow (`if tensor:` / `while tensor:`)",
     "replace the branch with torch.where(cond, a, b) or torch.cond; or decide on the host before the call"),
    (r"[Dd]ynamic shape operator|aten\.nonzero|aten\.unique|masked_select",
     "an op whose output shape depends on the data",
     "use a fixed-shape formulation (torch.where(mask, x, 0), a padded index) instead"),
    (r"`print`|builtin print|logging",
     "print/logging inside the compiled function",
     "log outside the compiled function, or add the logger to torch._dynamo.config.reorderable_logging_functions"),
    (r"Tensor\.item|\.item\(\)|Tensor\.tolist|Tensor\.numpy|_local_scalar_dense",
     "a tensor read back to Python (.item()/.tolist()/.numpy())",
     "keep the value as a tensor inside the compiled function; read it outside"),
    (r"[Uu]nsupported .*(call|function)|Attempted to call function marked as skipped|torch\._dynamo\.disable",
     "a call Dynamo cannot trace",
     "move the call out of the compiled function, or wrap it as a torch.library custom op"),
)

# The recompile class of a train()/eval() or grad-mode switch: Dynamo compiles one variant per mode, which
# is expected (not a problem) while a function has at most MODE_VARIANTS variants.
MODE_SWITCH = "a train/eval (grad mode) switch"
MODE_VARIANTS = 2

# Dynamo guard-failure text (regex) -> (class of recompile, the fix). First match wins.
RECOMPILE_HINTS: tuple[tuple[str, str, str], ...] = (
    (r"size mismatch|stride mismatch|\.size\(\)\[|\.stride\(\)\[", "changing input shapes",
     "pad the varying dimension to a few fixed buckets (e.g. multiples of 64), or torch._dynamo.mark_dynamic(x, dim)"),
    (r"dtype mismatch", "changing dtype", "cast the inputs to one dtype before the call"),
    (r"requires_grad mismatch", "changing requires_grad",
     "call it with the same requires_grad each time (or always under torch.no_grad())"),
    (r"device mismatch", "changing device", "move every input to the tpu device before the call"),
    (r"len\(", "a changing list/tuple length", "keep the container length fixed"),
    (r"(^|\s)\S+\s*==\s*-?[0-9][0-9.e+-]*(\s|$)", "a changing Python scalar",
     "pass the scalar as a tensor (torch.tensor(v, device=...)) so it is an input"),
    (r"___check_obj_id|___check_type_id|\bid\(", "a different object each call",
     "reuse the same module/function object instead of building a new one per call"),
    (r"grad_mode\s*$|\.training\s*==", MODE_SWITCH,
     "nothing needed: one compiled variant for training and one for eval/no_grad"),
    (r"grad_mode|GLOBAL_STATE|autocast", "changing global state (grad mode, autocast)",
     "keep grad mode and autocast the same around each call"),
)
