"""When no candidate fits: why (memory needed against HBM, and which part dominates), and the smallest
change that would fit, each checked by searching again with the change applied."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tputool.tune.candidate import ModelDims
from tputool.tune.hardware import Hardware, tpu_hardware
from tputool.tune.search import Row, fmt_bytes, predict_all
from tputool.tune.slices import Slice
from tputool.tune.space import SearchSpace
from tputool.tune.specs import DEFAULT_TOPOLOGIES


@dataclass(frozen=True)
class Misfit:
    """One of the closest candidates: what it needs, and what dominates."""

    key: str
    needed: float  # bytes/device
    available: float
    parts: dict[str, float]

    @property
    def dominant(self) -> str:
        """The largest part (params+grads+optimizer, gathered weights, activations)."""
        return max(self.parts, key=self.parts.get)

    def line(self) -> str:
        """`d1f256t1 b1 full flash/512 bf16: needs 40.2 GiB/device of 31.25 GiB (params+grads+optimizer 25.3 GiB, ...)`."""
        parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(self.parts.items(), key=lambda kv: -kv[1]))
        return f"{self.key}: needs {fmt_bytes(self.needed)}/device of {fmt_bytes(self.available)} ({parts})"


@dataclass(frozen=True)
class Change:
    """A change that makes some candidate fit, and the best plan under it."""

    what: str
    winner: str
    tokens_per_s: float


@dataclass(frozen=True)
class NoFit:
    """Why nothing fits, and what would."""

    closest: list[Misfit]
    change: Change | None

    def lines(self) -> list[str]:
        """Human-readable report, one item per line."""
        out = ["no candidate fits in memory; the closest:"]
        out += [f"  {m.line()}" for m in self.closest]
        if self.closest:
            out.append(f"  what dominates: {self.closest[0].dominant}")
        if self.change is not None:
            out.append(f"smallest change that fits: {self.change.what} (best plan {self.change.winner}, "
                       f"{self.change.tokens_per_s:,.0f} tok/s predicted)")
        else:
            out.append("no change tried fits (more chips, full remat or offload, larger fsdp/tensor, batch 1)")
        return out


def _fits(dims: ModelDims, hw: Hardware, space: SearchSpace, kernels: bool) -> Row | None:
    rows, _ = predict_all(dims, hw, space, kernels=kernels)
    fitting = [r for r in rows if r.status != "memory"]
    return fitting[0] if fitting else None


def _bigger_slices(sl: Slice) -> list[Slice]:
    """The same generation's standard slices with more chips, then 2, 4, 8 slices of the largest."""
    chips = sl.n_chips // sl.slices
    sizes = sorted(n for n in DEFAULT_TOPOLOGIES[sl.chip.torus_dims] if chips < n <= sl.chip.max_chips)
    out = [Slice(sl.chip, DEFAULT_TOPOLOGIES[sl.chip.torus_dims][n], sl.slices) for n in sizes]
    top = out[-1] if out else sl
    out += [Slice(top.chip, top.topology, top.slices * k) for k in (2, 4, 8)]
    return out


def explain(dims: ModelDims, hw: Hardware, space: SearchSpace, rows: list[Row], kernels: bool = True,
            closest: int = 3) -> NoFit:
    """Why none of `rows` fits, and the first change (in order of how little it asks) under which one does."""
    report: list[Misfit] = []
    for r in sorted(rows, key=lambda r: r.estimate.memory.total):
        m = Misfit(r.candidate.key, r.estimate.memory.total, r.estimate.hbm_bytes, r.estimate.memory.parts)
        if len(report) < closest and all(abs(m.needed - o.needed) > 0.01 * o.needed for o in report):
            report.append(m)  # distinct needs only (attention blocks often need the same)
    tries: list[tuple[str, Hardware, SearchSpace]] = []
    remats = space.remats
    if remats is not None and not {"full", "offload"} & set(remats):
        tries.append(("full remat (--remat full)", hw, dataclasses.replace(space, remats=(*remats, "full"))))
    if space.meshes is not None or space.max_tensor is not None:
        tries.append(("any fsdp/tensor split (drop --mesh/--max-tensor)", hw,
                      dataclasses.replace(space, meshes=None, max_tensor=None)))
    if space.global_batch is None:
        b = min(space.batches) // 2
        while b >= 1:  # the largest smaller batch that fits is found first
            tries.append((f"batch {b} per data shard (--batch {b})", hw, dataclasses.replace(space, batches=(b,))))
            b //= 2
    else:
        g = space.global_batch // 2
        while g >= 1:
            tries.append((f"a global batch of {g} (--global-batch {g})", hw, dataclasses.replace(space, global_batch=g)))
            g //= 2
    if hw.slice is not None:
        for sl in _bigger_slices(hw.slice):
            bigger = tpu_hardware(sl, efficiency=hw.eff)
            tries.append((f"more chips: {sl.name} ({sl.n_chips} chips)", bigger, space))
    for what, h, s in tries:
        row = _fits(dims, h, s, kernels)
        if row is not None:
            return NoFit(report, Change(what, row.candidate.key, row.estimate.tokens_per_s))
    return NoFit(report, None)
