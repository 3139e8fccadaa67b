"""Device-side index checks, CUDA's device-side asserts: computed on the device as part of the op.

A lowering registered with `checked=True` calls `require_in_range` on its index operands. While an executor
traces it inside `collecting()`, each call appends a *record* to the collector: an int64 vector
[code, value, dim, size], code 0 when every index is in range, else the `MESSAGES` entry of the first failing
check with the offending index value. The executor returns `combine(records)` (one record per checked op,
all zeros when nothing failed) next to the op's results, so nothing leaves the device until a sync point
reads it (`tputool.backend.asserts`). Outside `collecting()` (shape inference, tune) the checks do nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import jax
import jax.numpy as jnp

OUT_OF_RANGE, BOUNDS, TARGET, TAKE, INDEX_COPY = 1, 2, 3, 4, 5
MESSAGES = (
    "",
    "index out of range in self",
    "index {value} is out of bounds for dimension {dim} with size {size}",
    "Target {value} is out of bounds.",
    "out of range: tried to access index {value} on a tensor of {size} elements.",
    "index_copy_(): index {value} is out of bounds for dimension {dim} with size {size}",
)
"""PyTorch's CPU messages, by record code (formatted with the record's value, dim and size)."""

RECORD = 4
"""Length of a record: code, value, dim, size."""

_local = threading.local()


@contextmanager
def collecting() -> Iterator[list]:
    """Collect the records of the checks traced inside the block (into the list it yields)."""
    prev = getattr(_local, "records", None)
    _local.records = records = []
    try:
        yield records
    finally:
        _local.records = prev


def require_in_range(idx, low: int, high: int, code: int, dim: int = 0) -> None:
    """Check (on the device, when collecting) that every entry of `idx` lies in [low, high)."""
    records = getattr(_local, "records", None)
    if records is None or not hasattr(idx, "shape") or idx.size == 0:
        return
    flat = jnp.ravel(idx).astype(jnp.int64)
    bad = (flat < low) | (flat >= high)
    first = jnp.argmax(bad)
    failed = bad[first]
    records.append(jnp.stack([jnp.where(failed, code, 0), flat[first], jnp.asarray(dim, jnp.int64),
                              jnp.asarray(high, jnp.int64)]).astype(jnp.int64))


def combine(records: list) -> jax.Array:
    """The first failing record among `records` (all zeros when none failed or there are none)."""
    if not records:
        return jnp.zeros((RECORD,), jnp.int64)
    out = records[-1]
    for r in reversed(records[:-1]):
        out = jnp.where(r[0] != 0, r, out)
    return out


def fold(acc: jax.Array, record: jax.Array, seq) -> jax.Array:
    """`acc` (a record plus the sequence number of its op) if it holds a failure, else `record` numbered `seq`."""
    return jnp.where(acc[0] != 0, acc, jnp.concatenate([record, jnp.asarray(seq, jnp.int64).reshape(1)]))


def run_checked(fn: Callable, *args, **kwargs) -> tuple:
    """(fn(*args, **kwargs), its combined check record), for an executor tracing a checked lowering."""
    with collecting() as records:
        out = fn(*args, **kwargs)
    return out, combine(records)


def message(code: int, value: int, dim: int, size: int) -> str:
    """The PyTorch message of a failed record."""
    return MESSAGES[code].format(value=value, dim=dim, size=size)
