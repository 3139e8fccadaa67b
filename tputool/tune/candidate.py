"""A point in the tuning search space, and the model description the cost model reads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

REMAT_POLICIES = ("none", "save-dots", "save-qkv", "full", "offload")
"""Ordered from most memory/least compute to least memory/most compute. `save-qkv` keeps q, k, v and the
attention output and recomputes the feed-forward; `offload` is full remat with each layer's input kept in
host memory (MaxText's decoder_layer_input offload). Both are predicted-mode plans."""

MEASURED_REMAT_POLICIES = ("none", "save-dots", "full")
"""The policies the measured step can run (lower.py)."""

ATTENTION_IMPLS = ("plain", "chunked", "flash", "splash")
"""plain: materialise the (seq, seq) scores; chunked: query blocks, each recomputed in the backward; flash,
splash: JAX's Pallas TPU kernels (`tputool.backend.graph.attention_kernels.IMPLS`, the same names; interpret
mode off TPU) with query blocks of `block`."""

MOE_DISPATCHES = ("dense", "ragged", "gmm")
"""How a mixture of experts dispatches tokens (`tputool.models.moe.DISPATCHES`, the same names): dense (every
expert on every token), or sparse through grouped matmuls: jax.lax.ragged_dot, or the Pallas megablox kernels
(`tputool.backend.graph.grouped_matmul`; interpret mode off TPU)."""

PRECISIONS = ("bf16", "fp32")
"""Compute dtype of the forward/backward (the master weights and optimizer state stay fp32)."""

MESH_AXES = ("data", "fsdp", "tensor")

KERNEL_LANES = 128
"""The Pallas attention kernels' blocks are multiples of this on a TPU (the vector lane width)."""


def attention_problem(impl: str, block: int, seq: int) -> str | None:
    """Why attention `impl` with `block` is no candidate for sequence length `seq` (None: it is one)."""
    if impl == "chunked" and (block >= seq or seq % block):
        return f"block {block} does not split seq {seq}"
    if impl in ("flash", "splash"):
        if block > seq or seq % block:
            return f"{impl} block {block} does not divide seq {seq}"
        if block % KERNEL_LANES:
            return f"{impl} block {block} is not a multiple of {KERNEL_LANES} (the TPU lane width)"
    return None


@dataclass(frozen=True)
class Candidate:
    """One configuration: mesh (data, fsdp, tensor), batch, remat, attention, precision, MoE dispatch.

    `batch` is sequences per data-parallel shard: the global batch is batch x data x fsdp (the
    `tensor` devices of a shard work on the same sequences).
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    batch: int = 1
    remat: str = "none"
    attention: str = "plain"
    block: int = 0  # query block of chunked attention; the block size of the flash/splash kernels
    precision: str = "bf16"
    moe: str = ""  # MOE_DISPATCHES for a model that offers the choice; "": the model's own (fixed) dispatch

    def __post_init__(self) -> None:
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {self.attention!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.moe and self.moe not in MOE_DISPATCHES:
            raise ValueError(f"moe must be one of {MOE_DISPATCHES}, got {self.moe!r}")
        if (self.attention != "plain") != (self.block > 0):
            raise ValueError("block must be > 0 exactly when attention is not 'plain'")

    @property
    def n_devices(self) -> int:
        """data x fsdp x tensor."""
        return self.data * self.fsdp * self.tensor

    @property
    def mesh(self) -> dict[str, int]:
        """Axis name -> size, in mesh order."""
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

    @property
    def global_batch(self) -> int:
        """Sequences per step across all devices."""
        return self.batch * self.data * self.fsdp

    @property
    def key(self) -> str:
        """A short stable label, e.g. `d2f4t1 b4 save-dots chunked/16 bf16` (` moe:gmm` for a dispatch choice)."""
        return (f"d{self.data}f{self.fsdp}t{self.tensor} b{self.batch} {self.remat} {self.attention_label} "
                f"{self.precision}" + (f" moe:{self.moe}" if self.moe else ""))

    @property
    def attention_label(self) -> str:
        """`plain`, or the implementation and its block: `chunked/16`, `splash/512`."""
        return "plain" if self.attention == "plain" else f"{self.attention}/{self.block}"

    def to_dict(self) -> dict:
        """Plain dict for YAML/JSON."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelDims:
    """What the cost model needs to know about a model (a transformer, or any model with `seq=1`).

    `matmul_params` are the weights used in a matmul once per token (everything but the embedding
    lookup; a tied LM head counts once), all experts included. Models without attention set `layers=0`
    or `heads=0`. A mixture of experts sets `experts`, `top_k`, `expert_params` (the matmul weights of all
    experts) and `capacity` (expert tokens computed per routed token: 1.25 for capacity-factor dispatch,
    experts/top_k for dense dispatch, where every expert runs on every token). `moe_dispatches` are the
    dispatches the model can switch between (tputool's MoE: MOE_DISPATCHES; a candidate's `moe` picks one and
    `capacity` describes "dense"); empty: its dispatch is fixed, as `capacity` describes.
    """

    name: str
    params: int
    matmul_params: int
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0  # one expert's width for a mixture of experts
    seq: int = 1
    vocab: int = 0
    flops_per_token_override: float | None = None  # e.g. from HLO for a CNN
    experts: int = 0
    top_k: int = 0
    expert_params: int = 0
    capacity: float = 1.0
    moe_dispatches: tuple[str, ...] = ()
    causal: bool = True  # decoder attention: half the score matrix is masked
    state_bytes_per_param: int = 16  # fp32 master + grad + 2 AdamW moments; 8 for bf16 weights and state

    @property
    def active_matmul_params(self) -> float:
        """Matmul weights a token passes through: the router's top_k experts, not all of them."""
        if not self.experts:
            return float(self.matmul_params)
        return self.matmul_params - self.expert_params + self.expert_params * self.top_k / self.experts

    @property
    def ffn_per_token(self) -> float:
        """Feed-forward width a token's activations span: top_k x capacity experts for a mixture of experts."""
        return self.ffn * self.top_k * self.capacity if self.experts else float(self.ffn)

    @property
    def attention_flops_per_token(self) -> float:
        """12 x layers x seq x heads x head_dim: QK^T and AV, forward + backward, causal mask not halved."""
        return 12.0 * self.layers * self.seq * self.heads * self.head_dim

    @property
    def flops_per_token(self) -> float:
        """Training model FLOPs per token, tputool's convention: 6 x active matmul params + full attention."""
        if self.flops_per_token_override is not None:
            return self.flops_per_token_override
        return 6.0 * self.active_matmul_params + self.attention_flops_per_token

    @property
    def flops_per_token_maxtext(self) -> float:
        """Training model FLOPs per token, MaxText's convention: causal attention counted at half."""
        if self.flops_per_token_override is not None:
            return self.flops_per_token_override
        half = 0.5 if self.causal else 1.0
        return 6.0 * self.active_matmul_params + half * self.attention_flops_per_token
