"""Op by op inside one module: run it again on the same inputs on tpu and on the reference device.

`replay(module, args, kwargs, ...)` runs the module's forward twice under `OpLog` (a TorchDispatchMode that
keeps every ATen op's name, first output and the user's line that issued it): on tpu as it is, and on a
CPU copy (deep-copied, inputs copied, `tpu` mapped by `devicemap.DeviceMap`, autocast as the reference ran
it). The tpu module's buffers and both random generators are put back afterwards, so the run goes on as if
nothing happened. The two op logs are compared by `compare_ops`: first the user lines each side ran (a line
only one side ran is a device-dependent branch), then op by op (aligned by line and op name, since a device
may run another kernel for the same call) with `compare.diff`. `redraw` draws a random op again on the tpu
run's input and on the reference's from one random state: does the input's rounding alone change the draw?
"""

from __future__ import annotations

import contextlib
import copy
import difflib
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from tputool.diagnose.userframes import UserFrames
from tputool.parity.compare import diff
from tputool.parity.devicemap import DeviceMap
from tputool.parity.record import capture, fallback_count, first_tensor, is_random

UNINITIALIZED = ("aten.empty", "aten.new_empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty_strided")
REDRAW_SEED = 0


class OpLog(TorchDispatchMode):
    """Records each ATen op run under it: op, user file/line, fallback (ran on CPU), first output."""

    def __init__(self, frames: UserFrames, max_bytes: int) -> None:
        super().__init__()
        self.frames, self.max_bytes = frames, max_bytes
        self.ops: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        fb = fallback_count()
        out = func(*args, **(kwargs or {}))
        name = str(func)
        where = self.frames.location(1) or ("", 0)
        rec: dict[str, Any] = {"op": name, "file": where[0], "line": where[1], "fallback": fallback_count() > fb,
                               "value": None, "stats": None, "dtype": None}
        t = first_tensor(out)
        if t is not None and not name.startswith(UNINITIALIZED) and not is_random(name):
            rec.update(capture(t, self.max_bytes))
        self.ops.append(rec)
        return out


def _to(target: torch.device):
    def move(x):
        return x.detach().to(target) if isinstance(x, torch.Tensor) else x
    return move


def _rng_state() -> tuple:
    tpu = getattr(torch, "tpu", None)
    return torch.get_rng_state(), tpu.get_rng_state() if tpu is not None and hasattr(tpu, "get_rng_state") else None


def _set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.tpu.set_rng_state(state[1])


def replay(module: torch.nn.Module, args: tuple, kwargs: dict, frames: UserFrames, max_bytes: int,
           target: str = "cpu", ref_fp32: bool = False) -> tuple[list[dict], list[dict]]:
    """Run `module(*args, **kwargs)` op by op on its device and on a `target` copy; returns both op logs. The
    module's buffers are put back afterwards, their autograd versions too: the script's backward may still read
    a buffer its forward saved (BatchNorm's running statistics), which the replay's forward updated again."""
    saved = {n: b.detach().clone() for n, b in module.named_buffers()}
    versions = {n: b._version for n, b in module.named_buffers()}
    rng = _rng_state()
    dev = torch.device(target)
    amp_dtype = torch.get_autocast_dtype("tpu") if torch.is_autocast_enabled("tpu") else None
    if amp_dtype not in (torch.bfloat16, torch.float16):  # float32 autocast computes nothing lower (CPU refuses it)
        amp_dtype = None
    try:
        with torch.no_grad():
            ref_module = copy.deepcopy(module).to(dev)  # (before the replay below updates a buffer again)
            with OpLog(frames, max_bytes) as tpu_log:
                module(*args, **kwargs)
            ref_args, ref_kwargs = tree_map(_to(dev), args), tree_map(_to(dev), kwargs)
            amp = (torch.autocast(dev.type, dtype=amp_dtype) if amp_dtype is not None and not ref_fp32
                   else contextlib.nullcontext())
            # tensors=True: a tpu tensor the deep copy did not copy (a submodule a lambda attribute closes over,
            # a global) is read onto the target where a torch function meets it
            with DeviceMap(target, tensors=True), amp, OpLog(frames, max_bytes) as ref_log:
                ref_module(*ref_args, **ref_kwargs)
    finally:
        with torch.no_grad():
            kept = [(b, versions[n]) for n, b in module.named_buffers() if n in saved]
            for n, b in module.named_buffers():
                if n in saved:
                    b.copy_(saved[n])
        if kept:  # (each buffer holds again what it held at that version)
            torch._C._autograd._unsafe_set_version_counter(tuple(b for b, _ in kept), tuple(v for _, v in kept))
        _set_rng_state(rng)
    return tpu_log.ops, ref_log.ops


def redraw(func: Any, args: tuple, kwargs: dict, src: torch.Tensor, ref_src: torch.Tensor) -> tuple[Any, Any]:
    """A random op drawn again twice on CPU from one random state: on copies of the tpu run's arguments, and on
    the same with `src` (the tensor it draws from) replaced by the reference's value of it. Every generator
    becomes a CPU one seeded REDRAW_SEED (the default one too); the CPU random state is put back."""
    def on_cpu(swap: torch.Tensor | None):
        def move(x):
            if isinstance(x, torch.Tensor):
                return (swap if swap is not None and x is src else x).detach().to("cpu", x.dtype, copy=True)
            if isinstance(x, torch.Generator):
                return torch.Generator().manual_seed(REDRAW_SEED)
            if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("tpu")):
                return torch.device("cpu")
            return x
        return tree_map(move, args), tree_map(move, kwargs)

    state = torch.get_rng_state()
    out = []
    try:
        for swap in (None, ref_src):
            a, k = on_cpu(swap)
            torch.default_generator.manual_seed(REDRAW_SEED)
            out.append(func(*a, **k))
    finally:
        torch.set_rng_state(state)
    return out[0], out[1]


def _lines(ops: list[dict]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for o in ops:
        where = (o["file"], o["line"])
        if not out or out[-1] != where:
            out.append(where)
    return out


def compare_ops(tpu_ops: list[dict], ref_ops: list[dict], slack: float) -> dict:
    """Where the two op logs part: a line only one side ran (divergence), else the first op beyond tolerance."""
    result: dict[str, Any] = {"ops": len(tpu_ops), "ref_ops": len(ref_ops), "divergence": None, "first": None,
                              "random_ops": sorted({o["op"] for o in tpu_ops if is_random(o["op"])}),
                              "fallback_ops": sorted({o["op"] for o in tpu_ops if o["fallback"]}),
                              "random_at": next(({"op": o["op"], "file": o["file"], "line": o["line"]}
                                                 for o in tpu_ops if is_random(o["op"])), None)}
    a, b = _lines(tpu_ops), _lines(ref_ops)
    for tag, i1, i2, j1, _j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        side, where = ("tpu", a[i1]) if i2 > i1 else ("reference", b[j1])
        result["divergence"] = {"side": side, "file": where[0], "line": where[1]}
        break
    keys_a = [(o["file"], o["line"], o["op"]) for o in tpu_ops]
    keys_b = [(o["file"], o["line"], o["op"]) for o in ref_ops]
    sm = difflib.SequenceMatcher(None, keys_a, keys_b, autojunk=False)
    for blk in sm.get_matching_blocks():
        for k in range(blk.size):
            t, r = tpu_ops[blk.a + k], ref_ops[blk.b + k]
            if t["dtype"] is None or r["dtype"] is None:
                continue
            d = diff(t, r, 0, slack)
            if d["beyond"]:
                result["first"] = {"op": t["op"], "file": t["file"], "line": t["line"], "dtype": t["dtype"],
                                   "ref_dtype": r["dtype"], "fallback": t["fallback"], "index": blk.a + k,
                                   "random_before": any(is_random(o["op"]) for o in tpu_ops[:blk.a + k]),
                                   **{k2: d[k2] for k2 in ("max_abs", "max_rel", "ulps", "needed")}}
                return result
    return result
