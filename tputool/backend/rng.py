"""The tpu backend's random stream: a seed plus a counter; each random op gets key(seed) folded with the counter.

The (seed, counter) pair travels into the op's compiled kernel as one small uint32 array, so drawing a key
costs no extra dispatch, and `get_state`/`set_state` (torch.tpu.get_rng_state) capture it exactly.
"""

from __future__ import annotations

import jax
import numpy as np
import torch

from tputool.backend.runtime import DEFAULT_SEED, STATE

__all__ = ["DEFAULT_SEED", "manual_seed", "next_words", "key_from_words", "get_state", "set_state"]


def manual_seed(s: int) -> None:
    """Restart the stream from seed `s`."""
    STATE.rng_seed, STATE.rng_counter = int(s) & 0xFFFF_FFFF_FFFF_FFFF, 0


def next_words() -> np.ndarray:
    """The words of the next key (and advance the stream): [seed_hi, seed_lo, counter] as uint32."""
    s = STATE
    c, seed = s.rng_counter, s.rng_seed
    s.rng_counter = (c + 1) & 0xFFFF_FFFF
    return np.array([seed >> 32, seed & 0xFFFF_FFFF, c], dtype=np.uint32)


def key_from_words(words: jax.Array) -> jax.Array:
    """The JAX key for `next_words()`'s output (traceable, used inside compiled kernels)."""
    k = jax.random.key(0, impl="threefry2x32")
    k = jax.random.fold_in(k, words[0])
    k = jax.random.fold_in(k, words[1])
    return jax.random.fold_in(k, words[2])


def get_state() -> torch.Tensor:
    """The stream state as a CPU uint8 tensor (16 bytes: seed and counter, little-endian uint64)."""
    return torch.from_numpy(np.array([STATE.rng_seed, STATE.rng_counter], dtype="<u8").view(np.uint8).copy())


def set_state(state: torch.Tensor) -> None:
    """Restore a state returned by `get_state`."""
    arr = state.detach().cpu().contiguous().numpy()
    if arr.dtype != np.uint8 or arr.size != 16:
        raise ValueError("tpu rng state must be the 16-byte uint8 tensor returned by torch.tpu.get_rng_state()")
    STATE.rng_seed, STATE.rng_counter = (int(v) for v in arr.view("<u8"))
