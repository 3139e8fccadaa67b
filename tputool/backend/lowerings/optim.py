"""Optimizer and loss-scaling lowerings: the fused Adam/AdamW/SGD steps of `fused=True` optimizers and
GradScaler's `_amp_*` ops, each one computation over every tensor of its lists.

These are the functional twins (`_fused_adamw`, ...); the plan runs the in-place ops optimizers call
(`_fused_adamw_`, ...) through them and writes each result list back into the tensors it came from. As
PyTorch's CPU kernels: math in float32 for bfloat16/float16 tensors; with `grad_scale`, the gradients are
unscaled and written back; with `found_inf` equal to 1, nothing changes. `float` arguments are traced
(`dynamic_floats`), so a learning-rate schedule reuses the compiled step.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tputool.backend.lowerings import lowering

aten = torch.ops.aten


def _opmath(dt):
    return jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt


def _scalar(x, dt):
    """A number or a one-element tensor argument as a 0-d value of dtype `dt`."""
    return jnp.reshape(x, ()).astype(dt) if hasattr(x, "shape") else x


def _skipped(found_inf, new: list, old: list) -> list:
    """`new`, or `old` where `found_inf` (a one-element tensor or None) is 1: the step is skipped."""
    if found_inf is None:
        return new
    skip = jnp.reshape(found_inf, ()) == 1
    return [jnp.where(skip, o, n) for n, o in zip(new, old, strict=True)]


def _unscaled(grad, grad_scale, dt):
    g = grad.astype(dt)
    return g if grad_scale is None else g / _scalar(grad_scale, dt)


def _adam(adamw, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf):
    outs = ([], [], [], [], [])
    for i, p in enumerate(self):
        c = _opmath(p.dtype)
        g = _unscaled(grads[i], grad_scale, c)
        outs[1].append(g.astype(grads[i].dtype))
        if maximize:
            g = -g
        x, lr_ = p.astype(c), _scalar(lr, c)
        if adamw:
            x = jnp.where(weight_decay != 0, x - lr_ * weight_decay * x, x)
        else:
            g = jnp.where(weight_decay != 0, g + weight_decay * x, g)
        m = beta1 * exp_avgs[i].astype(c) + (1 - beta1) * g
        v = beta2 * exp_avg_sqs[i].astype(c) + (1 - beta2) * g * g
        step = _scalar(state_steps[i], c)
        step_size = lr_ / (1 - beta1 ** step)
        bc2_sqrt = jnp.sqrt(1 - beta2 ** step)
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i].astype(c), v)
            outs[4].append(vmax.astype(max_exp_avg_sqs[i].dtype))
            denom = jnp.sqrt(vmax) / bc2_sqrt + eps
        else:
            denom = jnp.sqrt(v) / bc2_sqrt + eps
        outs[0].append((x - step_size * m / denom).astype(p.dtype))
        outs[2].append(m.astype(exp_avgs[i].dtype))
        outs[3].append(v.astype(exp_avg_sqs[i].dtype))
    if not amsgrad:
        outs[4].extend(max_exp_avg_sqs)
    olds = (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
    return tuple(_skipped(found_inf, list(n), list(o)) for n, o in zip(outs, olds, strict=True))


@lowering(aten._fused_adam.default, aten._fused_adam.tensor_lr, dynamic_floats=True)
def fused_adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
               weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(False, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


@lowering(aten._fused_adamw.default, aten._fused_adamw.tensor_lr, dynamic_floats=True)
def fused_adamw(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(True, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


@lowering(aten._fused_sgd.default, aten._fused_sgd.tensor_lr, dynamic_floats=True)
def fused_sgd(self, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None):
    outs = ([], [], [])
    for i, p in enumerate(self):
        c = _opmath(p.dtype)
        g = _unscaled(grads[i], grad_scale, c)
        outs[1].append(g.astype(grads[i].dtype))
        if maximize:
            g = -g
        x = p.astype(c)
        g = jnp.where(weight_decay != 0, g + weight_decay * x, g)
        if momentum_buffer_list:
            old = momentum_buffer_list[i]
            buf = g if is_first_step else momentum * old.astype(c) + (1 - dampening) * g
            buf = jnp.where(momentum != 0, buf, old.astype(c))
            outs[2].append(buf.astype(old.dtype))
            g = jnp.where(momentum != 0, g + momentum * buf if nesterov else buf, g)
        outs[0].append((x - _scalar(lr, c) * g).astype(p.dtype))
    if not momentum_buffer_list:
        outs[2].extend(momentum_buffer_list)
    olds = (self, grads, momentum_buffer_list)
    return tuple(_skipped(found_inf, list(n), list(o)) for n, o in zip(outs, olds, strict=True))


@lowering(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_non_finite_check_and_unscale(self, found_inf, inv_scale):
    outs = []
    bad = jnp.zeros((), jnp.bool_)
    for x in self:
        c = _opmath(x.dtype)
        inv = _scalar(inv_scale, c)
        bad = bad | ~jnp.all(jnp.isfinite(x))
        outs.append(jnp.where(inv == 1, x, (x.astype(c) * inv).astype(x.dtype)))
    return outs, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lowering(aten._amp_update_scale.default, dynamic_floats=True)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    found = jnp.reshape(found_inf, ()) != 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = (self * scale_growth_factor).astype(self.dtype)
    scale = jnp.where(found, (self * scale_backoff_factor).astype(self.dtype),
                      jnp.where(grow & jnp.isfinite(grown), grown, self))
    tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful.astype(growth_tracker.dtype))
    return scale, tracker
