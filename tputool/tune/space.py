"""The search space: mesh shapes over the devices, batch, remat, attention, precision; with the reasons
each excluded combination was excluded (users ask "why not X?")."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tputool.tune.candidate import (
    ATTENTION_IMPLS,
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
    remats: tuple[str, ...] = REMAT_POLICIES
    attentions: tuple[tuple[str, int], ...] = (("plain", 0), ("chunked", 16))
    precisions: tuple[str, ...] = PRECISIONS
    max_tensor: int | None = None
    meshes: tuple[tuple[int, int, int], ...] | None = None  # only these (data, fsdp, tensor), if given

    def __post_init__(self) -> None:
        for impl, _ in self.attentions:
            if impl not in ATTENTION_IMPLS:
                raise ValueError(f"unknown attention implementation {impl!r}")


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


def enumerate_space(dims: ModelDims, n_devices: int, space: SearchSpace) -> Enumerated:
    """All valid candidates over `n_devices`, with each invalid family recorded once with its reason."""
    out = Enumerated([])
    for data, fsdp, tensor in meshes(n_devices):
        label = f"d{data}f{fsdp}t{tensor}"
        if space.meshes is not None and (data, fsdp, tensor) not in space.meshes:
            continue  # the user narrowed the meshes: nothing to explain
        if (why := mesh_problem(dims, data, fsdp, tensor, space)) is not None:
            out.rejected.append(Rejected(f"mesh {label}", why, "invalid"))
            continue
        for batch, remat, (impl, block), prec in itertools.product(
                space.batches, space.remats, space.attentions, space.precisions):
            if impl != "plain":
                if dims.heads == 0 or dims.seq <= 1:
                    continue  # no attention to chunk: the plain variant covers it
                if (why := attention_problem(impl, block, dims.seq)) is not None:
                    out.rejected.append(Rejected(f"{label} {impl}/{block}", why, "invalid"))
                    continue
            c = Candidate(data=data, fsdp=fsdp, tensor=tensor, batch=batch, remat=remat, attention=impl,
                          block=block, precision=prec)
            out.candidates.append(c)
    seen: set[str] = set()
    out.rejected = [r for r in out.rejected if not (r.what in seen or seen.add(r.what))]
    return out
