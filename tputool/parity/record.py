"""What a parity child records: every module call's output and every parameter's gradient, per step.

`Recorder.install()` registers global hooks: a module forward pre-hook (names the modules of each top-level
module the first time it is called, keeps the call stack), a forward hook (records the call's first tensor
output, keyed `step/out/name#call`), and an optimizer step pre-hook (records each parameter's `.grad`, keyed
`step/grad/name`). A step ends at an optimizer step; a script without one (inference) ends a step at the end
of each call of its first top-level module. After `max_steps` steps `StepLimit` stops the script. The inputs
of the first top-level module's calls are recorded too (`step/in/name#call`), so data that differs shows up
before the layers it feeds.

A random op called from Python outside any module call once the first top-level module has run
(torch.multinomial in a sampling loop, torch.randn_like noise between two models, ...; seen by `RandomWatch`,
a TorchFunctionMode; `is_random` and the tables above it say which ops draw from a random stream) is recorded
too (`step/random/torch.multinomial@model.py:304#call`: name OP@SITE, cls the op), with the value its draw
depends on (`input`: see `drawn_from`; None for shape-only draws) and where it ran (`site_file`,
`site_line`: the innermost frame outside torch and tputool). These records never depart by themselves (a
draw is allowed to differ); they explain the module records that depart after them.

Each entry: key, kind (in | out | grad | random), name, cls, step, call, file, line (the user's call site),
dtype, shape, autocast (dtype name or None), random (a dropout with p > 0 in training mode ran in this call),
fallbacks (CPU fallback ops of the backend inside this call), carried (the lowest floating precision the run
had passed through when this value was made: its own dtype, its module's autocast dtype unless autocast runs
that module in float32, and every earlier record's; a value computed from bfloat16 results carries bfloat16
error whatever its dtype) and value (a float32 CPU copy) or, above `max_bytes`, stats.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name

from tputool.diagnose.calls import is_model
from tputool.diagnose.userframes import UserFrames
from tputool.parity.compare import MANTISSA_BITS

FLOAT32_UNDER_AUTOCAST = (torch.nn.modules.normalization.LayerNorm, torch.nn.modules.normalization.GroupNorm,
                          torch.nn.modules.batchnorm._NormBase, torch.nn.Embedding, torch.nn.EmbeddingBag,
                          torch.nn.Softmax, torch.nn.LogSoftmax, torch.nn.modules.loss._Loss,
                          *((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()))
"""Module classes autocast runs in float32: their output keeps the precision of their inputs."""
RANDOM_MODULES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                  torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)
RANDOM_OPS = frozenset({
    "dropout", "native_dropout", "fused_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
    "dropout1d", "dropout2d", "dropout3d", "bernoulli", "rand", "rand_like", "randn", "randn_like", "randint",
    "randint_like", "randperm", "normal", "normal_functional", "uniform", "exponential", "cauchy", "geometric",
    "log_normal", "random", "multinomial", "poisson", "binomial", "standard_gamma", "sample_dirichlet",
    "rrelu", "rrelu_with_noise", "gumbel_softmax", "trunc_normal", "kaiming_uniform", "kaiming_normal",
    "xavier_uniform", "xavier_normal", "orthogonal"})
"""Ops that draw from a random stream, by base name (no leading/trailing underscores): ATen's and torch's."""
_OUTSIDE = (os.path.dirname(torch.__file__) + os.sep,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def is_random(op: str) -> bool:
    """True for an op that draws from a random stream, named as ATen names it (aten.native_dropout.default,
    aten.bernoulli_.float) or as torch.overrides.resolve_name names a torch function (torch.multinomial,
    torch.Tensor.normal_, torch.nn.functional.dropout). Backward ops (native_dropout_backward) draw nothing."""
    base = op.split(".")[1] if op.startswith("aten.") else op.rsplit(".", 1)[-1]
    return base.strip("_") in RANDOM_OPS


class StepLimit(BaseException):
    """Raised from a hook once the recorded steps are done: the script stops there."""


def first_tensor(x: Any) -> torch.Tensor | None:
    """The first tensor in a module's output (a tensor, tuple, list, dict or a dataclass-like output)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list | tuple):
        items = x
    elif isinstance(x, dict):
        items = list(x.values())
    elif hasattr(x, "__dict__") and not isinstance(x, type):
        items = list(vars(x).values())
    else:
        return None
    for v in items:
        t = first_tensor(v) if isinstance(v, list | tuple | dict | torch.Tensor) else None
        if t is not None:
            return t
    return None


def drawn_from(op: str, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The tensor whose values the random torch function `op` draws from (multinomial's probabilities,
    dropout's input, bernoulli's p): its first tensor argument, not an in-place draw's self nor `out=`; None
    when the draw depends only on shapes (randn, randn_like, normal_)."""
    if op.endswith("_like"):
        return None
    items = [*(args[1:] if op.endswith("_") else args), *(v for k, v in kwargs.items() if k != "out")]
    t = first_tensor(items)
    return t if t is not None and t.is_floating_point() else None


def call_site(depth: int = 1) -> tuple[str, int]:
    """The innermost frame above the caller outside torch and tputool as (file, line) (library code counts)."""
    f = sys._getframe(depth + 1)
    while f is not None and f.f_code.co_filename.startswith(_OUTSIDE):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else ("", 0)


STATS_CHUNK = 1 << 22
"""Elements per float64 chunk that `exact_stats` copies to the host at a time (32 MiB)."""


def exact_stats(t: torch.Tensor) -> dict:
    """Mean, std (Bessel-corrected) and 2-norm of `t` summed in float64 on the host, a chunk at a time: a float32
    sum of tens of millions of elements is off in the 4th digit on CPU, which would be a departure of the reference's
    own making; in float64 both runs' stats are exact to well below float32's rounding."""
    flat = t.detach().reshape(-1)
    n = flat.numel()

    def chunks():  # copied again on each pass: at most one float64 chunk is held
        return (flat[i:i + STATS_CHUNK].to("cpu", torch.float64) for i in range(0, n, STATS_CHUNK))

    mean = sum(float(c.sum()) for c in chunks()) / n if n else math.nan
    sq_dev, sq = 0.0, 0.0
    for c in chunks():
        sq_dev += float((c - mean).square().sum())
        sq += float(c.square().sum())
    return {"mean": mean, "std": math.sqrt(sq_dev / (n - 1)) if n > 1 else 0.0, "norm": math.sqrt(sq)}


def capture(t: torch.Tensor, max_bytes: int) -> dict:
    """A tensor as a record: dtype, shape and a float32 CPU copy, or only summary stats above `max_bytes`."""
    t = t.detach()
    out: dict = {"dtype": str(t.dtype), "shape": list(t.shape), "value": None, "stats": None}
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.numel() * 4 > max_bytes:
        out["stats"] = exact_stats(t)
        return out
    out["value"] = t.to("cpu", torch.float32 if t.is_floating_point() else t.dtype, copy=True)
    return out


PERTURB_SEED = 0
"""The seed of the signs `perturb` draws (its own generator: the script's random streams are not touched)."""


def perturb(module: torch.nn.Module) -> None:
    """Change every floating parameter of `module` by one rounding step of its dtype (x * (1 +- 2**-mantissa), the
    sign drawn per element): the twin reference run that measures how much this script amplifies rounding."""
    g = torch.Generator().manual_seed(PERTURB_SEED)
    with torch.no_grad():
        for p in module.parameters():
            bits = MANTISSA_BITS.get(str(p.dtype))
            if bits is None:
                continue
            sign = torch.randint(0, 2, p.shape, generator=g).to(p.device, p.dtype) * 2 - 1
            p.mul_(1 + sign * 2.0 ** -bits)


def autocast_dtype() -> str | None:
    """The dtype of the innermost enabled autocast (tpu, cuda or cpu), or None outside autocast."""
    for dev in ("tpu", "cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return str(torch.get_autocast_dtype(dev))
        except (RuntimeError, ValueError):
            continue
    return None


def fallback_count() -> int:
    """CPU fallback ops the bundled backend has run so far (0 without it)."""
    events = sys.modules.get("tputool.backend.events")
    return events.total("fallback") if events is not None else 0


def lowest(dtypes: list[str | None]) -> str | None:
    """The floating dtype name with the fewest mantissa bits among `dtypes` (None entries and others skipped)."""
    known = [d for d in dtypes if d in MANTISSA_BITS]
    return min(known, key=MANTISSA_BITS.__getitem__) if known else None


class Recorder:
    """Records module outputs and parameter gradients of the first `max_steps` steps (see the module doc)."""

    def __init__(self, frames: UserFrames, max_steps: int, max_bytes: int) -> None:
        self.frames, self.max_steps, self.max_bytes = frames, max_steps, max_bytes
        self.entries: list[dict] = []
        self.step = 0
        self.optimizer_steps = 0
        self.names: dict[int, str] = {}
        self.param_names: dict[int, str] = {}
        self.stack: list[tuple[torch.nn.Module, int, bool]] = []  # (module, fallbacks at entry, random)
        self.calls: dict[tuple[int, str], int] = {}
        self.first_root: int | None = None
        self.perturb = False  # the sensitivity twin: change the model's weights by one rounding step (`perturb`)
        self.early: dict[tuple[str, str, int], int] = {}  # (op, file, line) -> draws on the device before the model
        self.paused = False
        self.on_entry: list[Callable[[dict, torch.nn.Module, tuple, dict, Any], None]] = []
        # (entry, func, args, kwargs, the tensor drawn from) for each random op recorded outside modules
        self.on_random: list[Callable[[dict, Callable, tuple, dict, torch.Tensor | None], None]] = []
        self.watch = RandomWatch(self)
        self._handles: list = []
        self._roots: dict[str, int] = {}
        self.carried: str | None = None  # the lowest floating precision recorded so far (see the module doc)

    def install(self) -> None:
        """Register the global module and optimizer hooks."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post, with_kwargs=True),
                         register_optimizer_step_pre_hook(self._grads),
                         register_optimizer_step_post_hook(self._stepped)]
        self.watch.__enter__()

    def remove(self) -> None:
        """Unregister every hook."""
        for h in self._handles:
            h.remove()
        if self._handles:
            try:
                self.watch.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - the script left its own mode on the stack
                pass
        self._handles = []

    def _name_root(self, module: torch.nn.Module) -> None:
        base = type(module).__name__
        n = self._roots.get(base, 0)
        self._roots[base] = n + 1
        root = base if n == 0 else f"{base}_{n + 1}"
        for name, sub in module.named_modules():
            self.names.setdefault(id(sub), f"{root}.{name}" if name else root)
        for name, p in module.named_parameters():
            self.param_names.setdefault(id(p), f"{root}.{name}")

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if self.paused or os.getpid() != self.watch.pid:  # (a DataLoader worker's transforms record nothing)
            return
        if not self.stack:
            if id(module) not in self.names:
                self._name_root(module)
            if self.first_root is None and is_model(module):  # (a stateless transform is no model's call)
                self.first_root = id(module)
                if self.perturb:
                    perturb(module)
            if id(module) == self.first_root:
                if self.optimizer_steps == 0 and self.step >= self.max_steps:
                    raise StepLimit()  # an inference loop: max_steps top-level calls are recorded
                t = first_tensor(args)
                if t is not None and t.is_floating_point():
                    self._add("in", self.names[id(module)], module, t)
        is_random = isinstance(module, RANDOM_MODULES) and module.training and module.p > 0
        if is_random:
            for i in range(len(self.stack)):
                m, fb, _ = self.stack[i]
                self.stack[i] = (m, fb, True)
        self.stack.append((module, fallback_count(), is_random))

    def _add(self, kind: str, name: str, module: torch.nn.Module | None, t: torch.Tensor,
             random: bool = False, fallbacks: int = 0, cls: str | None = None) -> dict:
        call = self.calls.get((self.step, kind + name), 0)
        self.calls[(self.step, kind + name)] = call + 1
        where = self.frames.location(2) or ("", 0)
        amp = autocast_dtype()
        made_in = [str(t.dtype)] if t.is_floating_point() else []
        if kind == "out" and amp is not None and not isinstance(module, FLOAT32_UNDER_AUTOCAST):
            made_in.append(amp)
        self.carried = lowest([self.carried, *made_in])
        entry = {"key": f"{self.step}/{kind}/{name}#{call}", "kind": kind, "name": name,
                 "cls": cls or (type(module).__name__ if module is not None else "Parameter"),
                 "step": self.step,
                 "call": call, "file": where[0], "line": where[1], "autocast": amp,
                 "random": random, "fallbacks": fallbacks, "carried": self.carried, **capture(t, self.max_bytes)}
        self.entries.append(entry)
        return entry

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self.paused or not self.stack or os.getpid() != self.watch.pid:
            return
        _, fb0, is_random = self.stack.pop()
        name = self.names.get(id(module), type(module).__name__)
        t = first_tensor(output)
        if t is not None:
            entry = self._add("out", name, module, t, is_random, fallback_count() - fb0)
            for fn in self.on_entry:
                fn(entry, module, args, kwargs, output)
        if not self.stack and self.optimizer_steps == 0 and id(module) == self.first_root:
            self.step += 1
            self.calls.clear()

    def drawn(self, op: str, func: Callable, args: tuple, kwargs: dict, out: Any) -> None:
        """Record random op `op` (called as `func(*args, **kwargs)`, returning `out`) outside any module."""
        t = first_tensor(out)
        if t is None or isinstance(out, torch.nn.Parameter):  # initializing a parameter is not data
            return
        site = call_site(2)
        src = drawn_from(op, args, kwargs)
        entry = self._add("random", f"{op}@{os.path.basename(site[0])}:{site[1]}", None, t, True, cls=op)
        entry.update(site_file=site[0], site_line=site[1],
                     input=capture(src, self.max_bytes) if src is not None else None)
        for fn in self.on_random:
            fn(entry, func, args, kwargs, src)

    def drawn_early(self, op: str, out: Any) -> None:
        """Count random op `op` called before the model's first call (weight initialization, data made up front)
        when it drew on a device other than the CPU: those draws leave CPU's stream where the reference, which
        makes them on CPU, does not (`early_draws`, named by parity's input-data cause)."""
        t = first_tensor(out)
        if t is None or t.device.type == "cpu":
            return
        site = call_site(2)
        key = (op, site[0], site[1])
        self.early[key] = self.early.get(key, 0) + 1

    def early_draws(self) -> list[dict]:
        """The random ops drawn on the device before the model's first call, in first-call order."""
        return [{"op": op, "file": f, "line": ln, "count": n} for (op, f, ln), n in self.early.items()]

    def _grads(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.optimizer_steps == 0 and self.step > 0:
            self._renumber()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._add("grad", self.param_names.get(id(p), f"param{len(self.param_names)}"), None, p.grad)

    def _renumber(self) -> None:
        """Training after all: the top-level calls before the first optimizer step were all its step 0."""
        self.calls.clear()
        for e in self.entries:
            n = self.calls.get((0, e["kind"] + e["name"]), 0)
            self.calls[(0, e["kind"] + e["name"])] = n + 1
            e["step"], e["call"], e["key"] = 0, n, f"0/{e['kind']}/{e['name']}#{n}"
        self.step = 0

    def _stepped(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self.optimizer_steps += 1
        self.step += 1
        self.calls.clear()
        if self.step >= self.max_steps:
            raise StepLimit()


class RandomWatch(TorchFunctionMode):
    """Hands the recorder each random op called from Python outside any module call (see the module doc).
    It never changes what a call returns; inside torch.compile tracing it passes calls straight through."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.pid = os.getpid()  # a DataLoader worker forked from the script records nothing
        self._ops: dict[Any, str | None] = {}  # func -> its name when it is a random op, else None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        rec = self.recorder
        if rec.stack or rec.paused or os.getpid() != self.pid:
            return out
        try:
            op = self._ops.get(func, "")
            if op == "":
                name = resolve_name(func) or getattr(func, "__name__", "")
                op = self._ops[func] = name if isinstance(name, str) and is_random(name) else None
        except TypeError:  # an unhashable callable: not one of torch's random functions
            return out
        if op is not None:
            if rec.first_root is not None:
                rec.drawn(op, func, args, kwargs, out)
            else:
                rec.drawn_early(op, out)
        return out
