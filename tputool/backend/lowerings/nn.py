"""Neural-network lowerings: convolution (+ backward), layer norm (+ backward), average pooling, 2-d max
pooling with indices (+ backward), negative log likelihood (its targets checked on the device; its backward fusible).

Backwards are the JAX VJPs of the forward lowerings (max pooling's scatters the gradient to the saved
indices). Batch norm, dropout, other max poolings, losses and interpolation come from PyTorch's decompositions.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tputool.backend.lowerings import lowering
from tputool.backend.lowerings.checks import TARGET, require_in_range

aten = torch.ops.aten


def _acc(dt):
    return jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt


def _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):  # noqa: A002
    nd = input.ndim - 2
    if nd < 1:
        raise RuntimeError("convolution expects a batched input")
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    output_padding = list(output_padding) * nd if len(output_padding) == 1 else list(output_padding)
    spatial = "DHW"[3 - nd:] if nd <= 3 else None
    dn = lax.conv_dimension_numbers(input.shape, weight.shape,
                                    ("NC" + spatial, "OI" + spatial, "NC" + spatial))
    acc = jnp.float32 if input.dtype in (jnp.bfloat16, jnp.float16) else None
    if not transposed:
        out = lax.conv_general_dilated(input, weight, window_strides=stride,
                                       padding=[(p, p) for p in padding], rhs_dilation=dilation,
                                       dimension_numbers=dn, feature_group_count=groups,
                                       preferred_element_type=acc)
    else:
        # weight: (in, out/groups, k...) -> (out, in/groups, k...), flipped spatially.
        cin = weight.shape[0]
        w = weight.reshape((groups, cin // groups) + weight.shape[1:])
        w = jnp.swapaxes(w, 1, 2).reshape((groups * weight.shape[1], cin // groups) + weight.shape[2:])
        w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
        dn = lax.conv_dimension_numbers(input.shape, w.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial))
        k = weight.shape[2:]
        pads = [(dilation[i] * (k[i] - 1) - padding[i], dilation[i] * (k[i] - 1) - padding[i] + output_padding[i])
                for i in range(nd)]
        out = lax.conv_general_dilated(input, w, window_strides=[1] * nd, padding=pads, lhs_dilation=stride,
                                       rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
                                       preferred_element_type=acc)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * nd).astype(out.dtype)
    return out.astype(input.dtype)


@lowering(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):  # noqa: A002
    return _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@lowering(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,  # noqa: A002
                         output_padding, groups, output_mask):
    def f(x, w):
        return _conv(x, w, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(f, input, weight)
    gi, gw = vjp(grad_output.astype(input.dtype))
    nd = input.ndim - 2
    gb = jnp.sum(grad_output.astype(_acc(grad_output.dtype)), axis=(0,) + tuple(range(2, 2 + nd))).astype(
        grad_output.dtype) if output_mask[2] else None
    return (gi if output_mask[0] else None), (gw if output_mask[1] else None), gb


def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xa = x.astype(_acc(x.dtype))
    mean = jnp.mean(xa, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xa - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xa - mean) * rstd
    if weight is not None:
        out = out * weight.astype(out.dtype)
    if bias is not None:
        out = out + bias.astype(out.dtype)
    return out.astype(x.dtype), mean, rstd


@lowering(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):  # noqa: A002
    out, mean, rstd = _layer_norm(input, normalized_shape, weight, bias, eps)
    return out, mean.astype(_acc(input.dtype)), rstd.astype(_acc(input.dtype))


@lowering(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,  # noqa: A002
                               output_mask):
    # The standard layer-norm gradient, from the saved mean and rstd.
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    xa = input.astype(_acc(input.dtype))
    xhat = (xa - mean) * rstd
    g = grad_out.astype(xa.dtype)
    gw = g * weight.astype(xa.dtype) if weight is not None else g
    gx = rstd * (gw - jnp.mean(gw, axis=axes, keepdims=True) - xhat * jnp.mean(gw * xhat, axis=axes, keepdims=True))
    lead = tuple(range(input.ndim - len(normalized_shape)))
    dw = jnp.sum(g * xhat, axis=lead).astype(weight.dtype) if weight is not None and output_mask[1] else None
    db = jnp.sum(g, axis=lead).astype(bias.dtype) if bias is not None and output_mask[2] else None
    return (gx.astype(input.dtype) if output_mask[0] else None), dw, db


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    k = list(kernel_size) * nd if len(kernel_size) == 1 else list(kernel_size)
    s = list(stride) if stride else k
    s = s * nd if len(s) == 1 else s
    p = list(padding) * nd if len(padding) == 1 else list(padding)
    lead = x.ndim - nd
    pads = []
    for i in range(nd):
        size = x.shape[lead + i]
        out = (size + 2 * p[i] - k[i] + (s[i] - 1 if ceil_mode else 0)) // s[i] + 1
        if ceil_mode and (out - 1) * s[i] >= size + p[i]:
            out -= 1
        extra = max(0, (out - 1) * s[i] + k[i] - (size + 2 * p[i]))
        pads.append((p[i], p[i] + extra))
    full_pads = [(0, 0)] * lead + pads
    dims = (1,) * lead + tuple(k)
    strides = (1,) * lead + tuple(s)
    xa = x.astype(_acc(x.dtype))
    total = lax.reduce_window(xa, 0.0, lax.add, dims, strides, full_pads)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    if count_include_pad:
        # count window cells inside the (explicitly) padded input, excluding ceil_mode overhang
        # cells inside input + explicit padding count; ceil_mode overhang does not
        ones = jnp.ones(tuple(x.shape[lead + i] + 2 * p[i] for i in range(nd)), xa.dtype)
        cnt = lax.reduce_window(ones, 0.0, lax.add, tuple(k), tuple(s), [(0, e - b) for (b, e) in pads])
    else:
        ones = jnp.ones(x.shape[lead:], xa.dtype)
        cnt = lax.reduce_window(ones, 0.0, lax.add, tuple(k), tuple(s), pads)
    return (total / cnt).astype(x.dtype)


@lowering(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    padding = [padding] if isinstance(padding, int) else padding
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


@lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    _, vjp = jax.vjp(lambda x: _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                         divisor_override, 2), self)
    return vjp(grad_output.astype(self.dtype))[0]


# ---- max pooling (2-d, with indices) ----------------------------------------------------------------

def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    n = 2
    k = list(kernel_size) * (n // len(kernel_size))
    s = list(stride) * (n // len(stride)) if stride else k
    p = list(padding) * (n // len(padding))
    d = list(dilation) * (n // len(dilation))
    pads = []
    for i in range(n):
        size = x.shape[-n + i]
        eff = d[i] * (k[i] - 1) + 1
        num = size + 2 * p[i] - eff
        out = (-(-num // s[i]) if ceil_mode else num // s[i]) + 1
        if ceil_mode and (out - 1) * s[i] >= size + p[i]:
            out -= 1
        hi = (out - 1) * s[i] + eff - size - p[i]
        pads.append((p[i], max(hi, p[i])))
    return k, s, d, pads


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    k, s, d, pads = _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    idx = jnp.broadcast_to(jnp.arange(h * w, dtype=jnp.int64).reshape(h, w), x.shape)
    init_v = jnp.array(-jnp.inf, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.array(
        jnp.iinfo(x.dtype).min, x.dtype)

    def pick(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = (bv > av) | ((bv == av) & (bi < ai) & (ai >= 0)) | (ai < 0) | jnp.isnan(bv)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    dims = (1,) * len(lead) + tuple(k)
    strides = (1,) * len(lead) + tuple(s)
    dil = (1,) * len(lead) + tuple(d)
    full_pads = [(0, 0)] * len(lead) + pads
    vals, inds = lax.reduce_window((x, idx), (init_v, jnp.array(-1, jnp.int64)), pick, dims, strides, full_pads,
                                   window_dilation=dil)
    return vals, inds


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    g = grad.reshape((math.prod(lead), -1))
    i = indices.reshape((math.prod(lead), -1))
    rows = jnp.broadcast_to(jnp.arange(g.shape[0])[:, None], i.shape)
    out = jnp.zeros((g.shape[0], h * w), grad.dtype).at[rows, i].add(g)
    return out.reshape(x.shape)


@lowering(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    h, w = self.shape[-2:]
    oh, ow = grad_output.shape[-2:]

    def f(x):
        rows = []
        for i in range(oh):
            r0, r1 = (i * h) // oh, -(-((i + 1) * h) // oh)
            cols = []
            for j in range(ow):
                c0, c1 = (j * w) // ow, -(-((j + 1) * w) // ow)
                cols.append(jnp.mean(x[..., r0:r1, c0:c1], axis=(-2, -1)))
            rows.append(jnp.stack(cols, -1))
        return jnp.stack(rows, -2)

    _, vjp = jax.vjp(f, self.astype(_acc(self.dtype)))
    return vjp(grad_output.astype(_acc(self.dtype)))[0].astype(self.dtype)


# ---- upsampling backward (the forwards come from PyTorch's decompositions) -----------------------

def _src_scale(in_size, out_size, align_corners, scale):
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return 1.0 / scale if scale else in_size / out_size


def _nearest_axis(x, axis, out_size, scale, exact=False):
    n = x.shape[axis]
    s = _src_scale(n, out_size, False, scale)
    dst = jnp.arange(out_size, dtype=jnp.float32)
    src = jnp.floor((dst + 0.5) * s) if exact else jnp.floor(dst * s)
    idx = jnp.clip(src.astype(jnp.int32), 0, n - 1)
    return jnp.take(x, idx, axis=axis)


def _linear_axis(x, axis, out_size, align_corners, scale):
    n = x.shape[axis]
    s = _src_scale(n, out_size, align_corners, scale)
    dst = jnp.arange(out_size, dtype=jnp.float32)
    src = dst * s if align_corners else jnp.maximum((dst + 0.5) * s - 0.5, 0.0)
    i0 = jnp.clip(jnp.floor(src).astype(jnp.int32), 0, n - 1)
    i1 = jnp.minimum(i0 + 1, n - 1)
    w1 = (src - i0).astype(x.dtype)
    shape = [1] * x.ndim
    shape[axis] = out_size
    w1 = w1.reshape(shape)
    return jnp.take(x, i0, axis=axis) * (1 - w1) + jnp.take(x, i1, axis=axis) * w1


def _upsample_vjp(fwd, grad_output, input_size):
    x = jnp.zeros(tuple(input_size), _acc(grad_output.dtype))
    _, vjp = jax.vjp(fwd, x)
    return vjp(grad_output.astype(x.dtype))[0].astype(grad_output.dtype)


@lowering(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    def fwd(x):
        return _nearest_axis(_nearest_axis(x, 2, output_size[0], scales_h), 3, output_size[1], scales_w)

    return _upsample_vjp(fwd, grad_output, input_size)


@lowering(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _upsample_vjp(lambda x: _nearest_axis(x, 2, output_size[0], scales), grad_output, input_size)


@lowering(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    def fwd(x):
        y = _linear_axis(x, 2, output_size[0], align_corners, scales_h)
        return _linear_axis(y, 3, output_size[1], align_corners, scales_w)

    return _upsample_vjp(fwd, grad_output, input_size)


@lowering(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
    return _upsample_vjp(lambda x: _linear_axis(x, 2, output_size[0], align_corners, scales), grad_output,
                         input_size)


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, checked=True)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    cd = 1 if self.ndim >= 2 else 0
    n_classes = self.shape[cd]
    keep = target != ignore_index
    require_in_range(jnp.where(keep, target, 0), 0, n_classes, TARGET)
    safe = jnp.expand_dims(jnp.where(keep, target, 0), cd)
    picked = jnp.squeeze(jnp.take_along_axis(self, safe, axis=cd), cd)
    acc = _acc(self.dtype)
    w = jnp.where(keep, 1 if weight is None else weight[jnp.squeeze(safe, cd)], 0).astype(acc)
    losses = -picked.astype(acc) * w
    if reduction == 0 and self.ndim >= 2:  # 'none'
        return losses.astype(self.dtype), jnp.zeros((), self.dtype)
    total = jnp.sum(w)
    out = losses if reduction == 0 else (jnp.sum(losses) if reduction == 2 else jnp.sum(losses) / total)
    return out.astype(self.dtype), total.astype(self.dtype)


@lowering(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    # PyTorch's decomposition (a scatter of -1 into zeros, times the gradient) as one elementwise expression:
    # the one-hot comes from an iota, so XLA fuses it into its consumer (log_softmax's backward) instead of
    # materializing two more (N, C) buffers
    cd = 1 if self.ndim >= 2 else 0
    g = grad_output / total_weight if reduction == 1 else grad_output
    keep = jnp.expand_dims(target != ignore_index, cd)
    safe = jnp.where(keep, jnp.expand_dims(target, cd), 0)
    if self.ndim > g.ndim > 0:
        g = jnp.expand_dims(g, cd)
    if weight is not None:
        g = g * weight.reshape([weight.shape[0] if i == cd else 1 for i in range(self.ndim)])
    g = jnp.where(keep, g, 0)
    hot = lax.broadcasted_iota(safe.dtype, self.shape, cd) == safe
    one = jnp.ones((), self.dtype)  # (not Python floats: with x64 on they make the (N, C) select a float64 one)
    return (jnp.where(hot, -one, jnp.zeros((), self.dtype)) * g).astype(self.dtype)


# The fused RNN cells. ATen's LSTM/GRU cells (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell) call them for CUDA,
# XPU and PrivateUse1 tensors; CPU has no kernel for them, so the CPU fallback cannot run them. Same math and
# workspace layout as CUDA's kernels: gates in the accumulation type, outputs and workspace in the input dtype.


def _cell_args(gates, hidden, name):
    if gates.ndim != 2 or hidden.ndim != 2:
        raise RuntimeError(f"{name}: expected 2-D gates and hidden state, got {gates.ndim}-D and {hidden.ndim}-D")
    return _acc(gates.dtype)


def _biased(gates, bias, acc):
    return gates.astype(acc) if bias is None else gates.astype(acc) + bias.astype(acc)


@lowering(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    acc = _cell_args(input_gates, cx, "_thnn_fused_lstm_cell")
    g = _biased(input_gates, input_bias, acc) + _biased(hidden_gates, hidden_bias, acc)
    i, f, c, o = jnp.split(g, 4, axis=1)
    i, f, c, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(c), jax.nn.sigmoid(o)
    cy = f * cx.astype(acc) + i * c
    hy = o * jnp.tanh(cy)
    dt = input_gates.dtype
    return hy.astype(dt), cy.astype(dt), jnp.concatenate([i, f, c, o], axis=1).astype(dt)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    acc = _cell_args(workspace, cx, "_thnn_fused_lstm_cell_backward")
    i, f, c, o = (w.astype(acc) for w in jnp.split(workspace, 4, axis=1))
    go = 0.0 if grad_hy is None else grad_hy.astype(acc)
    gc = 0.0 if grad_cy is None else grad_cy.astype(acc)
    t = jnp.tanh(cy.astype(acc))
    gcx = go * o * (1 - t * t) + gc
    gates = jnp.concatenate([gcx * c * (1 - i) * i, gcx * cx.astype(acc) * (1 - f) * f, gcx * i * (1 - c * c),
                             go * t * (1 - o) * o], axis=1)
    dt = workspace.dtype
    grad_gates = gates.astype(dt)
    grad_bias = jnp.sum(grad_gates.astype(acc), axis=0).astype(dt) if has_bias else None
    return grad_gates, (gcx * f).astype(dt), grad_bias


@lowering(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    acc = _cell_args(input_gates, hx, "_thnn_fused_gru_cell")
    ir, ii, in_ = jnp.split(_biased(input_gates, input_bias, acc), 3, axis=1)
    hr, hi, hn = jnp.split(_biased(hidden_gates, hidden_bias, acc), 3, axis=1)
    r, z = jax.nn.sigmoid(ir + hr), jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    h = hx.astype(acc)
    dt = input_gates.dtype
    return (n + z * (h - n)).astype(dt), jnp.concatenate([r, z, n, h, hn], axis=1).astype(dt)


@lowering(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    acc = _cell_args(workspace, grad_hy, "_thnn_fused_gru_cell_backward")
    r, z, n, h, hn = (w.astype(acc) for w in jnp.split(workspace, 5, axis=1))
    go = grad_hy.astype(acc)
    gz = go * (h - n) * (1 - z) * z
    gn = go * (1 - z) * (1 - n * n)
    gr = gn * hn * (1 - r) * r
    dt = workspace.dtype
    g_in = jnp.concatenate([gr, gz, gn], axis=1).astype(dt)
    g_hid = jnp.concatenate([gr, gz, gn * r], axis=1).astype(dt)
    if not has_bias:
        return g_in, g_hid, (go * z).astype(dt), None, None
    return (g_in, g_hid, (go * z).astype(dt), jnp.sum(g_in.astype(acc), axis=0).astype(dt),
            jnp.sum(g_hid.astype(acc), axis=0).astype(dt))
