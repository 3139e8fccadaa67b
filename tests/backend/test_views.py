"""strided_read/strided_write agree with PyTorch's own strided views (random view chains, no tpu needed)."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tputool.backend.views import strided_read, strided_read_at, strided_write, strided_write_at


def _random_view(rng: random.Random, base: torch.Tensor) -> torch.Tensor:
    """A chain of 1-4 view ops (transpose, strided slice, select, unsqueeze, expand) of `base`."""
    t = base
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(["transpose", "slice", "select", "unsqueeze", "expand"])
        if op == "transpose" and t.dim() >= 2:
            a, b = rng.sample(range(t.dim()), 2)
            t = t.transpose(a, b)
        elif op == "slice" and t.dim() >= 1:
            d = rng.randrange(t.dim())
            n = t.shape[d]
            if n >= 2:
                lo = rng.randrange(n - 1)
                t = t.narrow(d, lo, rng.randint(1, n - lo)) if rng.random() < 0.5 else t[(slice(None),) * d + (slice(lo, None, rng.randint(1, 3)),)]
        elif op == "select" and t.dim() >= 2:
            d = rng.randrange(t.dim())
            t = t.select(d, rng.randrange(t.shape[d]))
        elif op == "unsqueeze":
            t = t.unsqueeze(rng.randrange(t.dim() + 1))
        elif op == "expand":
            ones = [d for d in range(t.dim()) if t.shape[d] == 1]
            if ones:
                shape = list(t.shape)
                shape[rng.choice(ones)] = rng.randint(2, 3)
                t = t.expand(shape)
    return t


def _case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, random view of it) for one seed."""
    rng = random.Random(seed)
    shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 4)))
    base = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    return base, _random_view(rng, base)


@pytest.mark.parametrize("seed", range(200))
def test_strided_read_matches_torch_views(seed: int) -> None:
    base, v = _case(seed)
    got = strided_read(jnp.asarray(base.reshape(-1).numpy()), tuple(v.shape), v.stride(), v.storage_offset())
    np.testing.assert_array_equal(np.asarray(got), v.numpy())


@pytest.mark.parametrize("seed", range(100))
def test_strided_write_matches_torch_views(seed: int) -> None:
    base, v = _case(seed)
    if any(s == 0 for s in v.stride()) and v.numel() > 1:
        return  # writing through an expanded view is not defined
    value = -torch.arange(v.numel(), dtype=torch.float32).reshape(v.shape) - 1
    flat = jnp.asarray(base.reshape(-1).numpy())
    got = strided_write(flat, jnp.asarray(value.numpy()), tuple(v.shape), v.stride(), v.storage_offset())
    v.copy_(value)
    np.testing.assert_array_equal(np.asarray(got), base.reshape(-1).numpy())


@pytest.mark.parametrize("seed", range(0, 100, 3))
def test_views_read_and_written_at_a_traced_offset_match_torch_views(seed: int) -> None:
    """strided_read_at/strided_write_at (the storage offset a value of the program) give strided_read/_write's
    results: the same random views."""
    base, v = _case(seed)
    flat = jnp.asarray(base.reshape(-1).numpy())
    size, stride = tuple(v.shape), v.stride()
    got = jax.jit(lambda f, o: strided_read_at(f, size, stride, o))(flat, v.storage_offset())
    np.testing.assert_array_equal(np.asarray(got), v.numpy())
    if any(s == 0 for s in stride) and v.numel() > 1:
        return
    value = -torch.arange(v.numel(), dtype=torch.float32).reshape(v.shape) - 1
    got = jax.jit(lambda f, x, o: strided_write_at(f, x, size, stride, o))(flat, jnp.asarray(value.numpy()),
                                                                         v.storage_offset())
    v.copy_(value)
    np.testing.assert_array_equal(np.asarray(got), base.reshape(-1).numpy())
