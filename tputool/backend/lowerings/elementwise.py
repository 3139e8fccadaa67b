"""Elementwise lowerings: unary math, binary arithmetic, comparisons, activations and their backwards.

Most entries are data (op -> (jnp function, PyTorch type-promotion kind)); the result dtype is computed
with PyTorch's own rules (`_util.promote`), inputs are cast to the computation dtype (float32 for bf16,
as PyTorch's opmath does) and the result cast to the result dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy import special as jsp
from torch._inductor import inductor_prims

from tputool.backend.lowerings import lowering
from tputool.backend.lowerings._util import KIND, cast, promote

aten = __import__("torch").ops.aten


def _sgn(x):
    if jnp.iscomplexobj(x):
        a = jnp.abs(x)
        return jnp.where(a == 0, 0, x / jnp.where(a == 0, 1, a))
    return _sign(x)


def _sign(x):
    """torch.sign: a bool is its own sign (JAX refuses sign on bool)."""
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


def _round(x, decimals=0):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x
    if decimals == 0:
        return jnp.round(x)
    f = 10.0 ** decimals
    return jnp.round(x * f) / f


def _frac(x):
    return x - jnp.trunc(x)


def _int_passthrough(fn):
    """floor/ceil/trunc of an integer tensor is the tensor."""
    return lambda x: x if not jnp.issubdtype(x.dtype, jnp.inexact) else fn(x)


UNARY = {
    aten.sin: (jnp.sin, KIND.INT_TO_FLOAT), aten.cos: (jnp.cos, KIND.INT_TO_FLOAT),
    aten.tan: (jnp.tan, KIND.INT_TO_FLOAT), aten.asin: (jnp.arcsin, KIND.INT_TO_FLOAT),
    aten.acos: (jnp.arccos, KIND.INT_TO_FLOAT), aten.atan: (jnp.arctan, KIND.INT_TO_FLOAT),
    aten.sinh: (jnp.sinh, KIND.INT_TO_FLOAT), aten.cosh: (jnp.cosh, KIND.INT_TO_FLOAT),
    aten.tanh: (jnp.tanh, KIND.INT_TO_FLOAT), aten.asinh: (jnp.arcsinh, KIND.INT_TO_FLOAT),
    aten.acosh: (jnp.arccosh, KIND.INT_TO_FLOAT), aten.atanh: (jnp.arctanh, KIND.INT_TO_FLOAT),
    aten.exp: (jnp.exp, KIND.INT_TO_FLOAT), aten.exp2: (jnp.exp2, KIND.INT_TO_FLOAT),
    aten.expm1: (jnp.expm1, KIND.INT_TO_FLOAT), aten.log: (jnp.log, KIND.INT_TO_FLOAT),
    aten.log2: (jnp.log2, KIND.INT_TO_FLOAT), aten.log10: (jnp.log10, KIND.INT_TO_FLOAT),
    aten.log1p: (jnp.log1p, KIND.INT_TO_FLOAT), aten.sqrt: (jnp.sqrt, KIND.INT_TO_FLOAT),
    aten.rsqrt: (lax.rsqrt, KIND.INT_TO_FLOAT), aten.sigmoid: (jax.nn.sigmoid, KIND.INT_TO_FLOAT),
    aten.erf: (jsp.erf, KIND.INT_TO_FLOAT), aten.erfc: (jsp.erfc, KIND.INT_TO_FLOAT),
    aten.erfinv: (jsp.erfinv, KIND.INT_TO_FLOAT), aten.lgamma: (jsp.gammaln, KIND.INT_TO_FLOAT),
    aten.digamma: (jsp.digamma, KIND.INT_TO_FLOAT), aten.reciprocal: (jnp.reciprocal, KIND.INT_TO_FLOAT),
    aten.i0: (jsp.i0, KIND.INT_TO_FLOAT), aten.special_i0e: (jsp.i0e, KIND.INT_TO_FLOAT),
    aten.special_i1: (jsp.i1, KIND.INT_TO_FLOAT), aten.special_i1e: (jsp.i1e, KIND.INT_TO_FLOAT),
    aten.special_ndtri: (jsp.ndtri, KIND.INT_TO_FLOAT), aten.special_erfcx: (jsp.erfcx, KIND.INT_TO_FLOAT),
    aten.special_log_ndtr: (jsp.log_ndtr, KIND.INT_TO_FLOAT), aten.sinc: (jnp.sinc, KIND.INT_TO_FLOAT),
    aten.deg2rad: (jnp.deg2rad, KIND.INT_TO_FLOAT), aten.rad2deg: (jnp.rad2deg, KIND.INT_TO_FLOAT),
    aten.neg: (jnp.negative, KIND.DEFAULT), aten.abs: (jnp.abs, KIND.COMPLEX_TO_FLOAT),
    aten.sign: (_sign, KIND.DEFAULT), aten.sgn: (_sgn, KIND.DEFAULT),
    aten.floor: (_int_passthrough(jnp.floor), KIND.DEFAULT),
    aten.ceil: (_int_passthrough(jnp.ceil), KIND.DEFAULT),
    aten.trunc: (_int_passthrough(jnp.trunc), KIND.DEFAULT), aten.frac: (_frac, KIND.DEFAULT),
    aten.bitwise_not: (lambda x: jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.bitwise_not(x), KIND.DEFAULT),
    aten.logical_not: (lambda x: jnp.logical_not(x.astype(bool)), KIND.ALWAYS_BOOL),
    aten.isnan: (jnp.isnan, KIND.ALWAYS_BOOL), aten.isinf: (jnp.isinf, KIND.ALWAYS_BOOL),
    aten.isposinf: (jnp.isposinf, KIND.ALWAYS_BOOL), aten.isneginf: (jnp.isneginf, KIND.ALWAYS_BOOL),
    aten.signbit: (jnp.signbit, KIND.ALWAYS_BOOL),
    aten.relu: (lambda x: jnp.where(x > 0, x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x, KIND.DEFAULT),
    aten.silu: (jax.nn.silu, KIND.INT_TO_FLOAT), aten.mish: (lambda x: x * jnp.tanh(jax.nn.softplus(x)), KIND.INT_TO_FLOAT),
    aten.hardsigmoid: (lambda x: jnp.clip(x / 6 + 0.5, 0, 1), KIND.DEFAULT),
    aten.hardswish: (lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1), KIND.DEFAULT),
    aten.positive: (lambda x: x, KIND.DEFAULT), aten.conj_physical: (jnp.conj, KIND.DEFAULT),
    aten.square: (jnp.square, KIND.BOOL_TO_LONG), aten.angle: (jnp.angle, KIND.INT_TO_FLOAT),
}


def _unary(fn, kind):
    def lower(self):
        comp, res = promote(kind, self)
        if kind is KIND.ALWAYS_BOOL:
            return fn(self).astype(bool)
        if kind is KIND.COMPLEX_TO_FLOAT and jnp.iscomplexobj(self):
            return fn(self).astype(res)
        return fn(cast(self, comp)).astype(res)

    return lower


for _op, (_fn, _kind) in UNARY.items():
    lowering(_op.default)(_unary(_fn, _kind))


@lowering(aten.round.default)
def round_(self):
    return _round(self)


@lowering(aten.round.decimals)
def round_decimals(self, *, decimals=0):
    comp, res = promote(KIND.DEFAULT, self)
    return _round(cast(self, comp), decimals).astype(res)


def _trunc_div(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return lax.div(a, b)
    return jnp.trunc(a / b)


def _floor_div(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.floor_divide(a, b)
    return jnp.floor(a / b)


BINARY = {
    aten.mul.Tensor: (jnp.multiply, KIND.DEFAULT), aten.mul.Scalar: (jnp.multiply, KIND.DEFAULT),
    aten.div.Tensor: (jnp.true_divide, KIND.INT_TO_FLOAT), aten.div.Scalar: (jnp.true_divide, KIND.INT_TO_FLOAT),
    aten.maximum.default: (jnp.maximum, KIND.DEFAULT), aten.minimum.default: (jnp.minimum, KIND.DEFAULT),
    aten.fmax.default: (jnp.fmax, KIND.DEFAULT), aten.fmin.default: (jnp.fmin, KIND.DEFAULT),
    aten.remainder.Tensor: (jnp.remainder, KIND.DEFAULT), aten.remainder.Scalar: (jnp.remainder, KIND.DEFAULT),
    aten.fmod.Tensor: (jnp.fmod, KIND.DEFAULT), aten.fmod.Scalar: (jnp.fmod, KIND.DEFAULT),
    aten.bitwise_and.Tensor: (jnp.bitwise_and, KIND.DEFAULT), aten.bitwise_and.Scalar: (jnp.bitwise_and, KIND.DEFAULT),
    aten.bitwise_or.Tensor: (jnp.bitwise_or, KIND.DEFAULT), aten.bitwise_or.Scalar: (jnp.bitwise_or, KIND.DEFAULT),
    aten.bitwise_xor.Tensor: (jnp.bitwise_xor, KIND.DEFAULT), aten.bitwise_xor.Scalar: (jnp.bitwise_xor, KIND.DEFAULT),
    aten.bitwise_left_shift.Tensor: (jnp.left_shift, KIND.DEFAULT),
    aten.bitwise_right_shift.Tensor: (jnp.right_shift, KIND.DEFAULT),
    aten.copysign.Tensor: (jnp.copysign, KIND.INT_TO_FLOAT), aten.copysign.Scalar: (jnp.copysign, KIND.INT_TO_FLOAT),
    aten.atan2.default: (jnp.arctan2, KIND.INT_TO_FLOAT), aten.hypot.default: (jnp.hypot, KIND.DEFAULT),
    aten.logaddexp.default: (jnp.logaddexp, KIND.DEFAULT), aten.logaddexp2.default: (jnp.logaddexp2, KIND.DEFAULT),
    aten.xlogy.Tensor: (jsp.xlogy, KIND.INT_TO_FLOAT), aten.xlogy.Scalar_Other: (jsp.xlogy, KIND.INT_TO_FLOAT),
    aten.xlogy.Scalar_Self: (jsp.xlogy, KIND.INT_TO_FLOAT),
    aten.special_xlog1py.default: (jsp.xlog1py, KIND.INT_TO_FLOAT),
    aten.nextafter.default: (jnp.nextafter, KIND.DEFAULT),
    aten.floor_divide.default: (_floor_div, KIND.DEFAULT), aten.floor_divide.Scalar: (_floor_div, KIND.DEFAULT),
    aten.pow.Tensor_Tensor: (jnp.power, KIND.BOOL_TO_LONG), aten.pow.Scalar: (jnp.power, KIND.BOOL_TO_LONG),
    aten.gcd.default: (jnp.gcd, KIND.DEFAULT), aten.lcm.default: (jnp.lcm, KIND.DEFAULT),
    aten.igamma.default: (jsp.gammainc, KIND.INT_TO_FLOAT), aten.igammac.default: (jsp.gammaincc, KIND.INT_TO_FLOAT),
    aten.special_zeta.default: (jsp.zeta, KIND.INT_TO_FLOAT),
}

COMPARE = {
    aten.eq: jnp.equal, aten.ne: jnp.not_equal, aten.lt: jnp.less, aten.le: jnp.less_equal,
    aten.gt: jnp.greater, aten.ge: jnp.greater_equal,
}

LOGICAL = {
    aten.logical_and: jnp.logical_and, aten.logical_or: jnp.logical_or, aten.logical_xor: jnp.logical_xor,
}


def _binary(fn, kind):
    def lower(self, other):
        comp, res = promote(kind, self, other)
        return fn(cast(self, comp), cast(other, comp)).astype(res)

    return lower


for _op, (_fn, _kind) in BINARY.items():
    lowering(_op)(_binary(_fn, _kind))

SMALL_POWER = 16
"""pow(x, n) with a whole-number exponent up to this size is repeated multiplication (lax.integer_pow), as
PyTorch's kernels special-case it; the general power is exp(n * log(x)), many times slower."""


@lowering(aten.pow.Tensor_Scalar, static_scalars=True)  # the exponent decides the computation
def pow_tensor_scalar(self, exponent):
    comp, res = promote(KIND.BOOL_TO_LONG, self, exponent)
    e = exponent
    whole = type(e) in (int, float) and float(e).is_integer() and abs(e) <= SMALL_POWER
    if whole and (jnp.issubdtype(comp, jnp.floating) or (jnp.issubdtype(comp, jnp.integer) and e >= 0)):
        return lax.integer_pow(cast(self, comp), int(e)).astype(res)  # (complex keeps pow: inf/nan cases)
    if type(e) is float and e == 0.5 and jnp.issubdtype(comp, jnp.floating) and self.dtype != jnp.float16:
        return jnp.sqrt(cast(self, comp)).astype(res)  # (as PyTorch's CPU kernel; its float16 one uses pow)
    return jnp.power(cast(self, comp), cast(e, comp)).astype(res)


def _compare(fn):
    def lower(self, other):
        comp, _ = promote(KIND.DEFAULT, self, other)
        return fn(cast(self, comp), cast(other, comp))

    return lower


for _pkt, _fn in COMPARE.items():
    lowering(_pkt.Tensor, _pkt.Scalar)(_compare(_fn))


def _logical(fn):
    def lower(self, other):
        return fn(jnp.asarray(self).astype(bool), jnp.asarray(other).astype(bool))

    return lower


for _pkt, _fn in LOGICAL.items():
    lowering(_pkt.default)(_logical(_fn))


def _scaled(other, alpha):
    if isinstance(alpha, int | float) and alpha == 1:
        return other
    return other * alpha


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(self, other, alpha=1):
    comp, res = promote(KIND.DEFAULT, self, other)
    return (cast(self, comp) + _scaled(cast(other, comp), alpha)).astype(res)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    comp, res = promote(KIND.DEFAULT, self, other)
    return (cast(self, comp) - _scaled(cast(other, comp), alpha)).astype(res)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    comp, res = promote(KIND.DEFAULT, self, other)
    return (cast(other, comp) - _scaled(cast(self, comp), alpha)).astype(res)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return _binary(jnp.true_divide, KIND.INT_TO_FLOAT)(self, other)
    comp, res = promote(KIND.DEFAULT, self, other)
    a, b = cast(self, comp), cast(other, comp)
    out = _trunc_div(jnp.asarray(a), b) if rounding_mode == "trunc" else _floor_div(jnp.asarray(a), b)
    return out.astype(res)


@lowering(aten.where.self)
def where(condition, self, other):
    comp, res = promote(KIND.DEFAULT, self, other)
    return jnp.where(condition.astype(bool), cast(self, res), cast(other, res)).astype(res)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(self, min=None, max=None):  # noqa: A002 - ATen argument names
    comp, res = promote(KIND.DEFAULT, self, min, max)
    x = cast(self, comp)
    if min is not None:
        x = jnp.maximum(x, cast(min, comp))
    if max is not None:
        x = jnp.minimum(x, cast(max, comp))
    if not jnp.issubdtype(comp, jnp.integer) and comp != jnp.bool_:
        # PyTorch propagates NaN from min/max bounds too
        if min is not None and not isinstance(min, int | float):
            x = jnp.where(jnp.isnan(cast(min, comp)), cast(min, comp), x)
        if max is not None and not isinstance(max, int | float):
            x = jnp.where(jnp.isnan(cast(max, comp)), cast(max, comp), x)
    return x.astype(res)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):  # noqa: A002
    return clamp(self, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):  # noqa: A002
    return clamp(self, None, max)


@lowering(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    comp, res = promote(KIND.DEFAULT, self, tensor1, tensor2)
    return (cast(self, comp) + _scaled(cast(tensor1, comp) * cast(tensor2, comp), value)).astype(res)


@lowering(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    comp, res = promote(KIND.INT_TO_FLOAT, self, tensor1, tensor2)
    return (cast(self, comp) + _scaled(cast(tensor1, comp) / cast(tensor2, comp), value)).astype(res)


@lowering(inductor_prims.fma)
def fma(a, b, c):
    """Inductor's `prims.fma`, (a * b) + c: Dynamo writes `addcmul_`/`addcdiv_` with a value, and `add_` with a
    tensor alpha, as it (e.g. a compiled optimizer step). In the opmath dtype (float32 for bf16/f16); float32's
    product is rounded before the add (at most one ulp from a fused multiply-add, as CUDA eager's addcmul)."""
    comp, res = promote(KIND.DEFAULT, a, b, c)
    return (cast(a, comp) * cast(b, comp) + cast(c, comp)).astype(res)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    comp, res = promote(KIND.DEFAULT, self, end, weight)
    a, b, w = cast(self, comp), cast(end, comp), cast(weight, comp)
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w)).astype(res)


@lowering(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(self.dtype, jnp.inexact):
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowering(aten.heaviside.default)
def heaviside(self, values):
    comp, res = promote(KIND.DEFAULT, self, values)
    return jnp.heaviside(cast(self, comp), cast(values, comp)).astype(res)


# ---- activations with parameters, and backwards ---------------------------------------------------

@lowering(aten.gelu.default)
def gelu(self, *, approximate="none"):
    comp, res = promote(KIND.INT_TO_FLOAT, self)
    return jax.nn.gelu(cast(self, comp), approximate=approximate == "tanh").astype(res)


@lowering(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    comp, res = promote(KIND.DEFAULT, self)
    return jnp.clip(cast(self, comp), min_val, max_val).astype(res)


@lowering(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    comp, res = promote(KIND.DEFAULT, self)
    x = cast(self, comp)
    return jnp.where(x > 0, x, x * negative_slope).astype(res)


@lowering(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    comp, res = promote(KIND.DEFAULT, self)
    x = cast(self, comp)
    return (jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * alpha * scale)).astype(res)


@lowering(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    comp, res = promote(KIND.DEFAULT, self)
    x = cast(self, comp)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta).astype(res)


@lowering(aten.threshold.default)
def threshold(self, threshold, value):
    comp, res = promote(KIND.DEFAULT, self)
    x = cast(self, comp)
    return jnp.where(x <= threshold, jnp.asarray(value, comp), x).astype(res)


@lowering(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    comp, res = promote(KIND.DEFAULT, grad_output, self)
    return jnp.where(cast(self, comp) <= threshold, jnp.zeros((), comp), cast(grad_output, comp)).astype(res)


@lowering(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    comp, res = promote(KIND.DEFAULT, grad_output, output)
    o = cast(output, comp)
    return (cast(grad_output, comp) * o * (1 - o)).astype(res)


@lowering(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    comp, res = promote(KIND.DEFAULT, grad_output, output)
    o = cast(output, comp)
    return (cast(grad_output, comp) * (1 - o * o)).astype(res)


def _vjp_backward(fwd):
    """A `*_backward(grad_output, self, ...)` lowering from the JAX VJP of a forward function."""

    def lower(grad_output, self, *args, **kwargs):
        comp, res = promote(KIND.DEFAULT, grad_output, self)
        _, vjp = jax.vjp(lambda x: fwd(x, *args, **kwargs), cast(self, comp))
        return vjp(cast(grad_output, comp))[0].astype(res)

    return lower


lowering(aten.gelu_backward.default)(
    _vjp_backward(lambda x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh")))
lowering(aten.silu_backward.default)(_vjp_backward(jax.nn.silu))
lowering(aten.mish_backward.default)(_vjp_backward(lambda x: x * jnp.tanh(jax.nn.softplus(x))))
lowering(aten.hardsigmoid_backward.default)(_vjp_backward(lambda x: jnp.clip(x / 6 + 0.5, 0, 1)))
lowering(aten.hardswish_backward.default)(_vjp_backward(lambda x: x * jnp.clip(x / 6 + 0.5, 0, 1)))
lowering(aten.hardtanh_backward.default)(_vjp_backward(lambda x, min_val, max_val: jnp.clip(x, min_val, max_val)))
lowering(aten.softplus_backward.default)(_vjp_backward(
    lambda x, beta, threshold: jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)))


@lowering(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    comp, res = promote(KIND.DEFAULT, grad_output, self)
    return jnp.where(cast(self, comp) > 0, cast(grad_output, comp),
                     cast(grad_output, comp) * negative_slope).astype(res)


@lowering(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    comp, res = promote(KIND.DEFAULT, grad_output, self_or_result)
    g, x = cast(grad_output, comp), cast(self_or_result, comp)
    if is_result:
        neg = g * input_scale * (x + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(x * input_scale)
    return jnp.where(x > 0, g * scale, neg).astype(res)


@lowering(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    comp, res = promote(KIND.INT_TO_FLOAT, self)
    x = cast(self, comp)
    return jax.nn.log_sigmoid(x).astype(res), jnp.zeros((0,), res)


@lowering(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    comp, res = promote(KIND.DEFAULT, grad_output, self)
    return (cast(grad_output, comp) * jax.nn.sigmoid(-cast(self, comp))).astype(res)

