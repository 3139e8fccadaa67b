"""The tpu backend's random stream: a seed plus a counter; each random op gets key(seed) folded with the counter.

The (seed, counter) pair travels into the op's compiled kernel as one small uint32 array, so drawing a key
costs no extra dispatch, and `get_state`/`set_state` (torch.tpu.get_rng_state) capture it exactly.
"""

from __future__ import annotations

import jax
import numpy as np
import torch

DEFAULT_SEED = 67280421310721
"""PyTorch's default seed for device generators."""

seed: int = DEFAULT_SEED
counter: int = 0


def manual_seed(s: int) -> None:
    """Restart the stream from seed `s`."""
    global seed, counter
    seed, counter = int(s) & 0xFFFF_FFFF_FFFF_FFFF, 0


def next_words() -> np.ndarray:
    """The words of the next key (and advance the stream): [seed_hi, seed_lo, counter] as uint32."""
    global counter
    c = counter
    counter = (counter + 1) & 0xFFFF_FFFF
    return np.array([seed >> 32, seed & 0xFFFF_FFFF, c], dtype=np.uint32)


def key_from_words(words: jax.Array) -> jax.Array:
    """The JAX key for `next_words()`'s output (traceable, used inside compiled kernels)."""
    k = jax.random.key(0, impl="threefry2x32")
    k = jax.random.fold_in(k, words[0])
    k = jax.random.fold_in(k, words[1])
    return jax.random.fold_in(k, words[2])


def get_state() -> torch.Tensor:
    """The stream state as a CPU uint8 tensor (16 bytes: seed and counter, little-endian uint64)."""
    return torch.from_numpy(np.array([seed, counter], dtype="<u8").view(np.uint8).copy())


def set_state(state: torch.Tensor) -> None:
    """Restore a state returned by `get_state`."""
    global seed, counter
    arr = state.detach().cpu().contiguous().numpy()
    if arr.dtype != np.uint8 or arr.size != 16:
        raise ValueError("tpu rng state must be the 16-byte uint8 tensor returned by torch.tpu.get_rng_state()")
    seed, counter = (int(v) for v in arr.view("<u8"))
