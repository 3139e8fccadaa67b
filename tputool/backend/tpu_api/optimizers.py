"""`torch.tpu.optimizers`: torch.optim-compatible optimizers whose `step()` is ONE compiled computation.

`Optimizer` (a `torch.optim.Optimizer`: param groups, state_dict, LR schedulers and step hooks work as
usual) gathers every parameter that has a gradient, in every group, with its gradient and state tensors,
and runs all their updates as one `jax.jit` computation, donating the parameters' and states' buffers (the
new values take their place). Per-step numbers (learning rate, bias corrections, ...) are inputs, not
constants, so a schedule does not recompile; only the update's structure (flags such as amsgrad, nesterov,
and the parameters' shapes) is part of the compile key. Subclasses give the per-parameter math in JAX:
`AdamW`, `Sgd` and `Muon` follow torch.optim.AdamW / SGD / Muon step for step (single-tensor algorithm); their
`foreach`/`fused`/`capturable` flags are accepted and ignored.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputool.backend import cache, runtime
from tputool.backend.tpu_api import _bridge

__all__ = ["AdamW", "MUON_NS_COEFFICIENTS", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer"]

_UNUSED_DONATION = "Some donated buffers were not usable"


class Optimizer(torch.optim.Optimizer):
    """Base class: per-parameter math in `_update` (pure JAX), run for all parameters as one computation.

    A subclass sets `state_names` (the parameter's state tensors, on tpu) and implements `_static` (the
    structural flags of one parameter's update, hashable), `_scalars` (its per-step numbers, on the host;
    it may advance host state such as the step count) and the static method `_update`."""

    state_names: tuple[str, ...] = ()
    xla_options: dict[str, Any] = {}
    """XLA options of the update computation (under the user's custom_compiler_options)."""

    def _static(self, group: dict, state: dict) -> tuple:
        """Hashable flags that change the update's structure (part of the compile key)."""
        raise NotImplementedError

    def _scalars(self, group: dict, state: dict) -> tuple[float, ...]:
        """This step's numbers for one parameter (inputs of the computation)."""
        raise NotImplementedError

    @staticmethod
    def _update(static: tuple, p: jax.Array, g: jax.Array, states: tuple, c: jax.Array) -> tuple:
        """(new parameter, new states) of one parameter; `c`: its scalars as a float64 vector."""
        raise NotImplementedError

    def _init_state(self, group: dict, p: torch.Tensor, state: dict) -> None:
        """Create a parameter's state on first use (torch.optim's names and layout)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter with a gradient (one compiled computation); returns closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params, grads, states, statics, scalars = [], [], [], [], []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                state = self.state[p]
                if not state:
                    self._init_state(group, p, state)
                statics.append(self._static(group, state))
                scalars.append(self._scalars(group, state))
                params.append(p)
                grads.append(p.grad)
                states.append(state)
        if not params:
            return loss
        _bridge.require_tpu(params, f"torch.tpu.optimizers.{type(self).__name__}")
        _bridge.require_tpu(grads, f"torch.tpu.optimizers.{type(self).__name__} (gradients)")
        names = self.state_names
        state_tensors = [tuple(s.get(n) for n in names) for s in states]
        reason = "torch.tpu.optimizers step"
        _bridge.settle(reason)  # (a deferred op may read a parameter whose buffer the step donates)
        p_arrs = _bridge.arrays(params, reason)
        g_arrs = _bridge.arrays(grads, reason)
        s_arrs = [tuple(None if t is None else _bridge.arrays([t], reason)[0] for t in ts) for ts in state_tensors]
        ids = [id(a) for a in p_arrs] + [id(a) for ts in s_arrs for a in ts if a is not None]
        fn = _jitted(type(self), donate=len(set(ids)) == len(ids))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
            new_p, new_s = cache.call(fn, f"torch.tpu.optimizers.{type(self).__name__}", tuple(statics),
                                      p_arrs, g_arrs, s_arrs, np.asarray(scalars, dtype=np.float64))
        for p, a in zip(params, new_p, strict=True):
            _bridge.store(p, a)
        for state, ts, arrs in zip(states, state_tensors, new_s, strict=True):
            for name, t, a in zip(names, ts, arrs, strict=True):
                if t is None:
                    if a is not None:
                        state[name] = _bridge.tensor(a)
                else:
                    _bridge.store(t, a)
        torch.autograd.graph.increment_version(params)
        return loss


_jits: dict = {}


def _jitted(cls: type, donate: bool) -> Callable:
    """The one computation updating a list of parameters with `cls._update` (cached per class and options)."""
    opts = {**cls.xla_options, **runtime.STATE.compiler_options}
    key = (cls, donate, tuple(sorted(opts.items())))
    fn = _jits.get(key)
    if fn is None:
        update = cls._update

        def run(statics, params, grads, states, scalars):
            new_p, new_s = [], []
            for i, (st, p, g, s) in enumerate(zip(statics, params, grads, states, strict=True)):
                a, b = update(st, p, g, s, scalars[i])
                new_p.append(a)
                new_s.append(b)
            return new_p, new_s

        fn = _jits[key] = jax.jit(run, static_argnums=(0,), donate_argnums=(1, 3) if donate else (),
                                  compiler_options=dict(opts) or None)
    return fn


IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable")
"""torch.optim's choices of implementation: accepted and ignored (the step is always one compiled computation)."""


def _implementation(flags: dict) -> None:
    """Accept torch.optim's implementation flags; refuse differentiable=True and unknown keywords."""
    flags = dict(flags)
    if flags.pop("differentiable", False):
        raise ValueError("differentiable=True is not supported: the step runs outside autograd, as one "
                         "compiled computation")
    unknown = sorted(set(flags) - set(IMPLEMENTATION_FLAGS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {unknown}")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


class AdamW(Optimizer):
    """torch.optim.AdamW (decoupled weight decay; amsgrad, maximize) with one compiled step."""

    state_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 **implementation: Any) -> None:
        _implementation(implementation)
        _check(0.0 <= float(lr), f"Invalid learning rate: {lr}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
        _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "amsgrad": amsgrad, "maximize": maximize})

    def _init_state(self, group: dict, p: torch.Tensor, state: dict) -> None:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        names = self.state_names if group["amsgrad"] else self.state_names[:2]
        for name in names:
            state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _static(self, group: dict, state: dict) -> tuple:
        return (bool(group["amsgrad"]), bool(group["maximize"]), group["weight_decay"] != 0)

    def _scalars(self, group: dict, state: dict) -> tuple[float, ...]:
        state["step"] += 1
        step = float(state["step"])
        lr, (beta1, beta2) = float(group["lr"]), group["betas"]
        return (1 - lr * group["weight_decay"], 1 - beta1, beta2, 1 - beta2, lr / (1 - beta1 ** step),
                (1 - beta2 ** step) ** 0.5, group["eps"])

    @staticmethod
    def _update(static: tuple, p: jax.Array, g: jax.Array, states: tuple, c: jax.Array) -> tuple:
        amsgrad, maximize, decay = static
        exp_avg, exp_avg_sq, max_sq = states
        c = c.astype(p.dtype)
        if maximize:
            g = -g
        if decay:
            p = p * c[0]
        exp_avg = exp_avg + c[1] * (g - exp_avg)
        exp_avg_sq = exp_avg_sq * c[2] + c[3] * g * g
        if amsgrad:
            max_sq = jnp.maximum(max_sq, exp_avg_sq)
            denom = jnp.sqrt(max_sq) / c[5] + c[6]
        else:
            denom = jnp.sqrt(exp_avg_sq) / c[5] + c[6]
        return p + -c[4] * exp_avg / denom, (exp_avg, exp_avg_sq, max_sq)


class Sgd(Optimizer):
    """torch.optim.SGD (momentum, dampening, nesterov, weight decay, maximize) with one compiled step."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 **implementation: Any) -> None:
        _implementation(implementation)
        _check(0.0 <= float(lr), f"Invalid learning rate: {lr}")
        _check(0.0 <= momentum, f"Invalid momentum value: {momentum}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        _check(not nesterov or (momentum > 0 and dampening == 0),
               "Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize})

    def _init_state(self, group: dict, p: torch.Tensor, state: dict) -> None:
        state["momentum_buffer"] = None

    def _static(self, group: dict, state: dict) -> tuple:
        momentum = group["momentum"] != 0
        return (bool(group["maximize"]), group["weight_decay"] != 0, momentum,
                momentum and state.get("momentum_buffer") is not None, bool(group["nesterov"]))

    def _scalars(self, group: dict, state: dict) -> tuple[float, ...]:
        return (float(group["lr"]), group["weight_decay"], group["momentum"], 1 - group["dampening"])

    @staticmethod
    def _update(static: tuple, p: jax.Array, g: jax.Array, states: tuple, c: jax.Array) -> tuple:
        maximize, decay, momentum, has_buf, nesterov = static
        (buf,) = states
        c = c.astype(p.dtype)
        if maximize:
            g = -g
        if decay:
            g = g + c[1] * p
        if momentum:
            buf = buf * c[2] + c[3] * g if has_buf else g
            g = g + c[2] * buf if nesterov else buf
        return p + -c[0] * g, (buf,)


MUON_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""torch.optim.Muon's default Newton-Schulz coefficients (a, b, c)."""


def _lerp(a: jax.Array, b: jax.Array, w: jax.Array) -> jax.Array:
    """torch.lerp's formula (from the nearer end, as its CPU kernel)."""
    return jnp.where(w < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


def _orthogonalize(g: jax.Array, coefficients: tuple, steps: int, eps: float) -> jax.Array:
    """torch.optim.Muon's Newton-Schulz iteration, in bfloat16 (float32 accumulation)."""
    a, b, c = coefficients
    bf16, f32 = jnp.bfloat16, jnp.float32
    tall = g.shape[0] > g.shape[1]
    x = g.astype(bf16)
    x = x.T if tall else x
    norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(f32)))).astype(bf16)
    x = x / jnp.maximum(norm, jnp.asarray(eps, bf16))

    def mm(u, v):
        return jnp.matmul(u, v, preferred_element_type=f32)

    for _ in range(steps):
        gram = mm(x, x.T).astype(bf16)
        update = (b * gram.astype(f32) + c * mm(gram, gram)).astype(bf16)
        x = (a * x.astype(f32) + mm(update, x)).astype(bf16)
    return x.T if tall else x


class Muon(Optimizer):
    """torch.optim.Muon (momentum, Newton-Schulz orthogonalized updates; 2-D parameters) with one compiled step."""

    state_names = ("momentum_buffer",)
    xla_options = {"xla_allow_excess_precision": False}
    """Round every bfloat16 value of the iteration as torch does (XLA would keep some in float32)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = MUON_NS_COEFFICIENTS,
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: str | None = None) -> None:
        _check(0.0 <= float(lr), f"Learning rate should be >= 0 but is: {lr}")
        _check(0.0 <= momentum, f"momentum should be >= 0 but is: {momentum}")
        _check(0.0 <= weight_decay, f"weight decay should be >= 0 but is: {weight_decay}")
        _check(adjust_lr_fn in (None, "original", "match_rms_adamw"),
               f"Adjust learning rate function {adjust_lr_fn} is not supported")
        _check(len(ns_coefficients) == 3 and ns_steps < 100, "ns_coefficients: 3 values; ns_steps: below 100")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "nesterov": nesterov, "ns_coefficients": tuple(ns_coefficients), "eps": eps,
                                  "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn})
        for group in self.param_groups:
            for p in group["params"]:
                _check(p.ndim == 2, f"Muon only supports 2D parameters whereas we found a parameter with size: "
                                    f"{p.size()}")

    def _init_state(self, group: dict, p: torch.Tensor, state: dict) -> None:
        state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)

    def _static(self, group: dict, state: dict) -> tuple:
        return (bool(group["nesterov"]), tuple(float(x) for x in group["ns_coefficients"]),
                int(group["ns_steps"]), float(group["eps"]))

    def _scalars(self, group: dict, state: dict) -> tuple[float, ...]:
        lr, fn = float(group["lr"]), group["adjust_lr_fn"]
        rows, cols = state["momentum_buffer"].shape
        if fn is None or fn == "original":
            ratio = math.sqrt(max(1, rows / cols))
        else:
            ratio = 0.2 * math.sqrt(max(rows, cols))
        momentum = group["momentum"]
        return (1 - momentum, momentum, 1 - lr * group["weight_decay"], lr * ratio)

    @staticmethod
    def _update(static: tuple, p: jax.Array, g: jax.Array, states: tuple, c: jax.Array) -> tuple:
        nesterov, coefficients, steps, eps = static
        (buf,) = states
        c = c.astype(p.dtype)
        buf = _lerp(buf, g, c[0])
        update = _lerp(g, buf, c[1]) if nesterov else buf
        update = _orthogonalize(update, coefficients, steps, eps)
        return p * c[2] + -c[3] * update.astype(p.dtype), (buf,)


class SingleTraceTrainer:
    """Not available here (see the error)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "torch.tpu.optimizers.SingleTraceTrainer is not available in tputool's bundled backend: tracing "
            "forward, backward and update as one computation is not implemented; compile the model with "
            "torch.compile(backend='tpu') and step a torch.tpu.optimizers optimizer (one computation each)")
