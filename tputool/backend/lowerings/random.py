"""Random lowerings. Each gets `rng_key` from the backend's stream (tputool.backend.rng); draws are made
in float32 (or the tensor's wider dtype) and cast, so bf16 tensors get proper bf16-rounded samples."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tputool.backend.lowerings import lowering
from tputool.backend.lowerings._util import default_float, np_dtype

aten = torch.ops.aten


def _draw_dtype(dt):
    return jnp.float64 if dt == jnp.float64 else jnp.float32


def _floats_only(dt, what: str) -> None:
    """PyTorch's refusal of an integer or bool dtype for a continuous distribution (NotImplementedError)."""
    if dt == jnp.bool_ or jnp.issubdtype(dt, jnp.integer):
        raise NotImplementedError(f'"{what}" not implemented for {jnp.dtype(dt).name}')


@lowering(aten.uniform.default, needs_rng=True)
def uniform(self, from_=0.0, to=1.0, *, generator=None, rng_key, **kw):
    lo = kw.get("from", from_)
    _floats_only(self.dtype, "check_uniform_bounds")
    u = jax.random.uniform(rng_key, self.shape, _draw_dtype(self.dtype))
    return (lo + u * (to - lo)).astype(self.dtype)


@lowering(aten.normal_functional.default, needs_rng=True)
def normal(self, mean=0.0, std=1.0, *, generator=None, rng_key):
    _floats_only(self.dtype, "normal_kernel")
    return (mean + std * jax.random.normal(rng_key, self.shape, _draw_dtype(self.dtype))).astype(self.dtype)


@lowering(aten.normal.float_float, needs_rng=True, static_scalars=True, dynamic_floats=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                       rng_key):
    """`torch.normal(mean, std, size)`: the draw of `empty(size).normal_(mean, std)`, which CUDA's kernel makes."""
    dt = np_dtype(dtype) or default_float()
    _floats_only(dt, "normal_kernel")
    return (mean + std * jax.random.normal(rng_key, tuple(size), _draw_dtype(dt))).astype(dt)


@lowering(aten.normal.Tensor_float, needs_rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, rng_key):
    return (mean + std * jax.random.normal(rng_key, mean.shape, _draw_dtype(mean.dtype))).astype(mean.dtype)


@lowering(aten.normal.float_Tensor, needs_rng=True)
def normal_float_tensor(mean, std, *, generator=None, rng_key):
    return (mean + std * jax.random.normal(rng_key, std.shape, _draw_dtype(std.dtype))).astype(std.dtype)


@lowering(aten.normal.Tensor_Tensor, needs_rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, rng_key):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return (mean + std * jax.random.normal(rng_key, shape, _draw_dtype(mean.dtype))).astype(mean.dtype)


@lowering(aten.bernoulli.p, needs_rng=True)
def bernoulli_p(self, p=0.5, *, generator=None, rng_key):
    return (jax.random.uniform(rng_key, self.shape, jnp.float32) < p).astype(self.dtype)


@lowering(aten.bernoulli.Tensor, needs_rng=True)
def bernoulli_tensor(self, p, *, generator=None, rng_key):
    return (jax.random.uniform(rng_key, self.shape, _draw_dtype(p.dtype)) < p).astype(self.dtype)


@lowering(aten.bernoulli.default, needs_rng=True)
def bernoulli(self, *, generator=None, rng_key):
    return (jax.random.uniform(rng_key, self.shape, _draw_dtype(self.dtype)) < self).astype(self.dtype)


def _int_range(dt):
    if dt == jnp.bool_:
        return 0, 2
    if jnp.issubdtype(dt, jnp.integer):
        info = jnp.iinfo(dt)
        return 0, int(info.max) + 1
    # floats: [0, 2^mantissa]
    return 0, 2 ** (jnp.finfo(dt).nmant + 1) + 1


def _randint(key, shape, lo, hi, dt):
    span = hi - lo
    if span <= 2**31 - 1:
        r = jax.random.randint(key, shape, 0, span, jnp.int64)
    else:
        r = jax.random.randint(key, shape, 0, min(span, 2**63 - 1), jnp.int64)
    return (r + lo).astype(dt)


@lowering(aten.random.default, needs_rng=True)
def random_(self, *, generator=None, rng_key):
    lo, hi = _int_range(self.dtype)
    return _randint(rng_key, self.shape, lo, hi, self.dtype)


@lowering(aten.random.to, needs_rng=True)
def random_to(self, to, *, generator=None, rng_key):
    return _randint(rng_key, self.shape, 0, to, self.dtype)


@lowering(getattr(aten.random, "from"), needs_rng=True)
def random_from(self, from_, to=None, *, generator=None, rng_key, **kw):
    lo = kw.get("from", from_)
    hi = to if to is not None else _int_range(self.dtype)[1]
    return _randint(rng_key, self.shape, lo, hi, self.dtype)


@lowering(aten.exponential.default, needs_rng=True)
def exponential(self, lambd=1.0, *, generator=None, rng_key):
    return (jax.random.exponential(rng_key, self.shape, _draw_dtype(self.dtype)) / lambd).astype(self.dtype)


@lowering(aten.geometric.default, needs_rng=True)
def geometric(self, p, *, generator=None, rng_key):
    u = jax.random.uniform(rng_key, self.shape, jnp.float64 if self.dtype == jnp.float64 else jnp.float32,
                           minval=jnp.finfo(jnp.float32).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(self.dtype)


@lowering(aten.log_normal.default, needs_rng=True)
def log_normal(self, mean=1.0, std=2.0, *, generator=None, rng_key):
    return jnp.exp(mean + std * jax.random.normal(rng_key, self.shape, _draw_dtype(self.dtype))).astype(self.dtype)


@lowering(aten.cauchy.default, needs_rng=True)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None, rng_key):
    return (median + sigma * jax.random.cauchy(rng_key, self.shape, _draw_dtype(self.dtype))).astype(self.dtype)


@lowering(aten.randperm.default, aten.randperm.generator, needs_rng=True, static_scalars=True)
def randperm(n, *, dtype=torch.int64, layout=None, device=None, pin_memory=None, generator=None, rng_key):
    return jax.random.permutation(rng_key, n).astype(_int_dtype(dtype))


@lowering(aten.native_dropout.default, needs_rng=True)
def native_dropout(input, p, train, *, rng_key):  # noqa: A002
    if not train or p == 0:
        return input, jnp.ones(input.shape, jnp.bool_)
    if p == 1:
        return jnp.zeros_like(input), jnp.zeros(input.shape, jnp.bool_)
    keep = jax.random.uniform(rng_key, input.shape, jnp.float32) >= p
    scale = 1.0 / (1.0 - p)
    return jnp.where(keep, input * scale, 0).astype(input.dtype), keep


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return (grad_output * mask.astype(grad_output.dtype) * scale).astype(grad_output.dtype)


@lowering(aten.rand.default, aten.rand.generator, needs_rng=True, static_scalars=True)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, generator=None, rng_key):
    dt = np_dtype(dtype) or default_float()
    _floats_only(dt, "check_uniform_bounds")
    return jax.random.uniform(rng_key, tuple(size), _draw_dtype(dt)).astype(dt)


@lowering(aten.randn.default, aten.randn.generator, needs_rng=True, static_scalars=True)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None, generator=None, rng_key):
    dt = np_dtype(dtype) or default_float()
    _floats_only(dt, "normal_kernel")
    return jax.random.normal(rng_key, tuple(size), _draw_dtype(dt)).astype(dt)


@lowering(aten.rand_like.default, aten.rand_like.generator, needs_rng=True)
def rand_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, generator=None,
              rng_key):
    dt = np_dtype(dtype) or self.dtype
    _floats_only(dt, "check_uniform_bounds")
    return jax.random.uniform(rng_key, self.shape, _draw_dtype(dt)).astype(dt)


@lowering(aten.randn_like.default, aten.randn_like.generator, needs_rng=True)
def randn_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, generator=None,
               rng_key):
    dt = np_dtype(dtype) or self.dtype
    _floats_only(dt, "normal_kernel")
    return jax.random.normal(rng_key, self.shape, _draw_dtype(dt)).astype(dt)


def _int_dtype(dtype):
    """randint's dtype: the schema's default arrives as ScalarType code 4 (int64) when none was given."""
    return jnp.int64 if dtype is None or dtype == 4 else np_dtype(dtype)


def _checked_range(lo: int, hi: int) -> None:
    if not lo < hi:
        raise ValueError(f"random_ expects 'from' to be less than 'to', but got from={lo} >= to={hi}")


@lowering(aten.randint.default, aten.randint.generator, needs_rng=True, static_scalars=True)
def randint(high, size, *, dtype=torch.int64, layout=None, device=None, pin_memory=None, generator=None, rng_key):
    _checked_range(0, high)
    return _randint(rng_key, tuple(size), 0, high, _int_dtype(dtype))


@lowering(aten.randint.low, aten.randint.low_generator, needs_rng=True, static_scalars=True)
def randint_low(low, high, size, *, dtype=torch.int64, layout=None, device=None, pin_memory=None, generator=None,
                rng_key):
    _checked_range(low, high)
    return _randint(rng_key, tuple(size), low, high, _int_dtype(dtype))


@lowering(aten.randint_like.default, aten.randint_like.generator, needs_rng=True, static_scalars=True)
def randint_like(self, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
                 generator=None, rng_key):
    _checked_range(0, high)
    return _randint(rng_key, self.shape, 0, high, np_dtype(dtype) or self.dtype)


@lowering(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, needs_rng=True, static_scalars=True)
def randint_like_low(self, low, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
                     generator=None, rng_key):
    _checked_range(low, high)
    return _randint(rng_key, self.shape, low, high, np_dtype(dtype) or self.dtype)
