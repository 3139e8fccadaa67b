"""torch.dtype <-> JAX/NumPy dtype tables for the tpu backend (data, plus two lookup helpers).

JAX runs with `jax_enable_x64` on (set by `tputool.backend.device.register`), so int64 and float64
tensors keep their exact dtype and values instead of being silently narrowed to 32 bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

TORCH_TO_NP: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
}
"""Every torch dtype a tpu tensor can hold."""

NP_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_NP.items()}

# NumPy dtypes torch.from_numpy cannot take: moved through a same-width integer view instead.
BITCAST_VIA: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, np.dtype(np.int16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(np.uint8)),
    torch.float8_e5m2: (torch.uint8, np.dtype(np.uint8)),
}


def to_np(dtype: torch.dtype) -> np.dtype:
    """The NumPy/JAX dtype of a torch dtype; TypeError naming it when the backend cannot hold it."""
    try:
        return TORCH_TO_NP[dtype]
    except KeyError:
        raise TypeError(f"tpu backend: dtype {dtype} is not supported") from None


def to_torch(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a JAX/NumPy dtype."""
    try:
        return NP_TO_TORCH[dtype]
    except KeyError:
        return NP_TO_TORCH[np.dtype(dtype)]
