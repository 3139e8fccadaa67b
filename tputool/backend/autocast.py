"""`torch.autocast("tpu")`: a fallthrough on AutocastPrivateUse1 plus cast rules for the listed ops.

Matmul/conv-like ops run in the autocast dtype (bfloat16 by default); numerically sensitive ops run in
float32 — the same split PyTorch uses for CUDA.
"""

from __future__ import annotations

import torch

LOWER_PRECISION = (
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "mv", "addmv", "addr", "dot",
    "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "prelu", "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "einsum", "chain_matmul", "linalg_multi_dot",
)
"""Ops whose floating inputs are cast to the autocast dtype."""

FP32 = (
    "softmax", "log_softmax", "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "norm", "frobenius_norm",
    "nll_loss", "cross_entropy_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits",
    "kl_div", "exp", "log", "log10", "log2", "log1p", "pow", "reciprocal", "rsqrt", "sum", "prod", "cumsum",
    "cumprod", "logsumexp", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "softplus", "cosine_similarity",
)
"""Ops whose bfloat16/float16 inputs are cast to float32."""

_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _cast_all(x, dtype, only_low: bool):
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.dtype != torch.float64 and x.device.type == "tpu":
            if only_low and x.dtype not in (torch.bfloat16, torch.float16):
                return x
            return x.to(dtype)
        return x
    if isinstance(x, list | tuple):
        return type(x)(_cast_all(v, dtype, only_low) for v in x)
    return x


def _make(op, to_fp32: bool):
    def kernel(*args, **kwargs):
        dtype = torch.float32 if to_fp32 else torch.get_autocast_dtype("tpu")
        args = _cast_all(args, dtype, to_fp32)
        kwargs = {k: _cast_all(v, dtype, to_fp32) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_KS):
            return op(*args, **kwargs)

    return kernel


DEFAULT_DTYPE = torch.bfloat16
"""`torch.autocast("tpu")`'s dtype when none is given, as on the real TorchTPU (PyTorch's default for a
PrivateUse1 device is float16, which `get_amp_supported_dtype` refuses: autocast would warn and turn off)."""


def register(keep: list) -> None:
    """Install the fallthrough and the cast kernels; libraries are appended to `keep` (kept alive).

    Also makes bfloat16 the default autocast dtype of tpu. PyTorch keeps that default per thread: this sets it
    for the registering thread (the one importing torch); another thread that opens `torch.autocast("tpu")`
    without a dtype gets PyTorch's warning, and passes `dtype=torch.bfloat16`."""
    torch.set_autocast_dtype("tpu", DEFAULT_DTYPE)
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    keep.append(lib)
    aten_lib = torch.library.Library("aten", "IMPL")
    keep.append(aten_lib)
    for names, fp32 in ((LOWER_PRECISION, False), (FP32, True)):
        for name in names:
            pkt = getattr(torch.ops.aten, name, None)
            if pkt is None:
                continue
            for ov in pkt.overloads():
                op = getattr(pkt, ov)
                s = op._schema
                if any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments):
                    continue
                if not any(str(a.type) in ("Tensor", "List[Tensor]", "Optional[Tensor]") for a in s.arguments):
                    continue
                aten_lib.impl(name + ("" if ov == "default" else f".{ov}"), _make(op, fp32), "AutocastPrivateUse1")
