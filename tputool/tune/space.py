"""The search space: mesh shapes over the devices, batch, remat, attention, precision; with the reasons
each excluded combination was excluded (users ask "why not X?")."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tputool.tune.candidate import (
    ATTENTION_IMPLS,
    MEASURED_REMAT_POLICIES,
    MOE_DISPATCHES,
    PRECISIONS,
    REMAT_POLICIES,
    Candidate,
    ModelDims,
    attention_problem,
)


@dataclass(frozen=True)
class SearchSpace:
    """Values each knob may take; meshes are every (data, fsdp, tensor) whose product is the device count."""

    batches: tuple[int, ...] = (1, 2, 4)
    remats: tuple[str, ...] | None = None  # None: every policy the mode can run
    attentions: tuple[tuple[str, int], ...] | None = None  # None: chosen from the sequence length
    precisions: tuple[str, ...] = PRECISIONS
    max_tensor: int | None = None
    meshes: tuple[tuple[int, int, int], ...] | None = None  # only these (data, fsdp, tensor), if given
    global_batch: int | None = None  # sequences per step; replaces `batches` (batch = global / (data x fsdp))
    moes: tuple[str, ...] | None = None  # MoE dispatches; None: every one the model offers (see default_moes)

    def __post_init__(self) -> None:
        for impl, _ in self.attentions or ():
            if impl not in ATTENTION_IMPLS:
                raise ValueError(f"unknown attention implementation {impl!r}")
        for moe in self.moes or ():
            if moe not in MOE_DISPATCHES:
                raise ValueError(f"unknown MoE dispatch {moe!r}")


MIN_CHUNK = 512
"""Smallest query block worth running on a TPU for long sequences (smaller blocks starve the MXU)."""

PLAIN_MAX_SEQ = 2048
"""Above this sequence length plain attention's (seq x seq) scores are not a candidate by default."""

KERNEL_IMPLS = ("flash", "splash")
"""Pallas TPU attention kernels: candidates for a TPU target (predicted mode)."""


def default_attentions(seq: int, kernels: bool = False) -> tuple[tuple[str, int], ...]:
    """Attention candidates for a sequence length: plain for short ones, query blocks of >= 512 (or
    seq/4) that divide seq, and with `kernels` the Pallas kernels at those blocks."""
    out: list[tuple[str, int]] = []
    if seq <= PLAIN_MAX_SEQ:
        out.append(("plain", 0))
    small = max(min(MIN_CHUNK, seq // 4), 1)
    blocks = sorted({blk for blk in (small, seq // 8, seq // 4, 1024, 2048)
                     if blk >= small and blk < seq and seq % blk == 0})
    out += [("chunked", blk) for blk in blocks[:3]]
    if kernels:
        kblocks = [blk for blk in (512, 1024, 2048) if blk <= seq and seq % blk == 0] or [seq]
        out += [(k, blk) for k in KERNEL_IMPLS if k in ATTENTION_IMPLS for blk in kblocks]
    return tuple(out) or (("plain", 0),)


def default_moes(dims: ModelDims, kernels: bool = False) -> tuple[str, ...]:
    """MoE dispatch candidates: none ("", the model's own) unless the model offers a choice; then all of them
    when measured, dense and the megablox kernel for a TPU target (ragged_dot predicts the same FLOPs)."""
    if not dims.moe_dispatches:
        return ("",)
    return tuple(m for m in dims.moe_dispatches if not kernels or m != "ragged")


@dataclass(frozen=True)
class Rejected:
    """A candidate (or a whole family, e.g. a mesh) left out, and why."""

    what: str
    reason: str
    stage: str  # invalid | memory | pruned | failed


def meshes(n_devices: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, tensor) with data x fsdp x tensor == n_devices."""
    out = []
    for t in range(1, n_devices + 1):
        if n_devices % t:
            continue
        rest = n_devices // t
        for f in range(1, rest + 1):
            if rest % f == 0:
                out.append((rest // f, f, t))
    return out


def mesh_problem(dims: ModelDims, data: int, fsdp: int, tensor: int, space: SearchSpace) -> str | None:
    """Why a mesh cannot run this model, or None."""
    if space.max_tensor is not None and tensor > space.max_tensor:
        return f"tensor={tensor} above the limit {space.max_tensor}"
    if tensor > 1:
        if dims.heads and dims.heads % tensor:
            return f"heads={dims.heads} not divisible by tensor={tensor}"
        if dims.kv_heads and dims.kv_heads % tensor:
            return f"kv_heads={dims.kv_heads} not divisible by tensor={tensor}"
        if dims.ffn and dims.ffn % tensor:
            return f"ffn={dims.ffn} not divisible by tensor={tensor}"
        if dims.heads == 0 and dims.ffn == 0:
            return "no attention heads or feed-forward width to split over tensor"
    return None


@dataclass
class Enumerated:
    """Valid candidates and everything excluded before any prediction."""

    candidates: list[Candidate]
    rejected: list[Rejected] = field(default_factory=list)


def enumerate_space(dims: ModelDims, n_devices: int, space: SearchSpace, kernels: bool = False) -> Enumerated:
    """All valid candidates over `n_devices`, with each invalid family recorded once with its reason.

    `kernels` (a TPU target, predicted mode) adds the Pallas attention kernels and host offload to the
    default choices.
    """
    out = Enumerated([])
    attentions = space.attentions if space.attentions is not None else default_attentions(dims.seq, kernels)
    remats = space.remats if space.remats is not None else (REMAT_POLICIES if kernels else MEASURED_REMAT_POLICIES)
    moes = default_moes(dims, kernels)
    if space.moes is not None and dims.moe_dispatches:
        moes = tuple(m for m in space.moes if m in dims.moe_dispatches) or moes
    for data, fsdp, tensor in meshes(n_devices):
        label = f"d{data}f{fsdp}t{tensor}"
        if space.meshes is not None and (data, fsdp, tensor) not in space.meshes:
            continue  # the user narrowed the meshes: nothing to explain
        if (why := mesh_problem(dims, data, fsdp, tensor, space)) is not None:
            out.rejected.append(Rejected(f"mesh {label}", why, "invalid"))
            continue
        batches = space.batches
        if space.global_batch is not None:
            shards = data * fsdp
            if space.global_batch % shards:
                out.rejected.append(Rejected(f"mesh {label}", f"global batch {space.global_batch} does not split "
                                             f"over data x fsdp = {shards}", "invalid"))
                continue
            batches = (space.global_batch // shards,)
        for batch, remat, (impl, block), prec, moe in itertools.product(
                batches, remats, attentions, space.precisions, moes):
            if not kernels and remat not in MEASURED_REMAT_POLICIES:
                out.rejected.append(Rejected(f"remat {remat}", "a TPU plan: predicted mode (--target) only; the "
                                             "measured step runs none/save-dots/full remat", "invalid"))
                continue
            if impl != "plain":
                if dims.heads == 0 or dims.seq <= 1:
                    continue  # no attention to chunk: the plain variant covers it
                if (why := attention_problem(impl, block, dims.seq)) is not None:
                    out.rejected.append(Rejected(f"{label} {impl}/{block}", why, "invalid"))
                    continue
            c = Candidate(data=data, fsdp=fsdp, tensor=tensor, batch=batch, remat=remat, attention=impl,
                          block=block, precision=prec, moe=moe)
            out.candidates.append(c)
    seen: set[str] = set()
    out.rejected = [r for r in out.rejected if not (r.what in seen or seen.add(r.what))]
    return out
