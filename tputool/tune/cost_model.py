"""Cost model of one training step (forward, backward, AdamW update) of a Candidate on a machine.

Conventions, stated once:
- MFU (tputool's convention) = model FLOPs / (step time x devices x peak), with model FLOPs per token =
  6 x active matmul params + 12 x layers x seq x heads x head_dim (PaLM/torchtitan: causal attention
  NOT halved). `mfu_maxtext` counts causal attention at half (MaxText's convention since its PR #1988);
  both are printed. A mixture of experts counts its top_k experts (active params). Remat recompute and
  capacity padding count in HFU, not MFU. A candidate's sparse MoE dispatch (`Candidate.moe` ragged/gmm)
  computes each routed token once plus the grouped matmul's row-tile padding (`sparse_capacity`), in place
  of the model's dense capacity (experts/top_k).
- Master weights, gradients and AdamW moments take `ModelDims.state_bytes_per_param` (16: fp32), sharded
  by the candidate's partition rules; the compute copy is in the candidate's precision.

Step time = matmul compute + attention compute + HBM-bound work (norms, residuals, rotary, SwiGLU gates,
softmax through HBM, logits, the optimizer update) + the collectives that do not hide under compute
+ a fixed per-step cost. Each op class runs at a fraction of its peak (`Hardware.eff`, calibrated per
chip generation, see efficiency.py). Collectives: FSDP all-gathers/reduce-scatters per layer overlap
with that layer's compute (only the excess is exposed, plus the first gather); DP gradient all-reduces
overlap with the backward; tensor-parallel all-reduces sit on the critical path; axes that cross slices
pay DCN for their share.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.hardware import Hardware

REMAT_RECOMPUTE = {"none": 0.0, "save-dots": 0.0, "save-qkv": 0.0, "full": 1.0, "offload": 1.0}
"""Extra forward passes of the layers' attention per step (save-qkv keeps q, k, v and the attention output)."""

REMAT_ELEMENTWISE_RECOMPUTE = {"none": 0.0, "save-dots": 1.0, "save-qkv": 1.0, "full": 1.0, "offload": 1.0}
"""Extra forward passes of the layers' elementwise work per step (save-dots recomputes all but the dots)."""

OPTIMIZER_TRAFFIC = 1.75
"""HBM bytes an AdamW update moves per byte of training state (reads param, grad, 2 moments; writes 3)."""

GATHERED_LAYERS_IN_FLIGHT = 2
"""FSDP keeps the layer being computed and the next one's prefetched weights."""

SCORE_PASSES = {"plain": 10.0, "chunked": 14.0}
"""HBM passes over the fp32 (seq x seq) scores per layer when attention runs as XLA ops (fwd 4, bwd 6;
chunked recomputes each block's forward in the backward)."""

GMM_ROW_TILE = 128
"""Rows per tile of the grouped matmul (`graph/grouped_matmul.default_tiling`): each expert's group ends in a
partial tile, half a tile of padding on average."""


def sparse_capacity(model: ModelDims, tokens: float) -> float:
    """Expert rows computed per routed row under sparse (grouped matmul) dispatch of `tokens` tokens: one,
    plus half a row tile of padding per expert."""
    rows = max(tokens * model.top_k, 1.0)
    return 1.0 + model.experts * GMM_ROW_TILE / 2 / rows


def dispatched(model: ModelDims, c: Candidate) -> ModelDims:
    """`model` as candidate `c` dispatches its experts: a sparse `c.moe` replaces the dense capacity (groups
    per device: a data shard's tokens, their sequence split over `tensor` where it divides it)."""
    if not model.experts or c.moe in ("", "dense"):
        return model
    seq = model.seq // c.tensor if model.seq % c.tensor == 0 else model.seq
    return dataclasses.replace(model, capacity=sparse_capacity(model, c.batch * seq))


@dataclass(frozen=True)
class AttentionKernel:
    """How an attention implementation spends FLOPs and memory."""

    causal_skip: bool  # skips the masked half of a causal score matrix
    scores_in_hbm: bool  # the (seq x seq) scores go through HBM
    bwd_recompute: float  # extra forward passes of attention inside the backward


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "plain": AttentionKernel(causal_skip=False, scores_in_hbm=True, bwd_recompute=0.0),
    "chunked": AttentionKernel(causal_skip=False, scores_in_hbm=True, bwd_recompute=1.0),
    "flash": AttentionKernel(causal_skip=True, scores_in_hbm=False, bwd_recompute=1.0),
    "splash": AttentionKernel(causal_skip=True, scores_in_hbm=False, bwd_recompute=1.0),
}
"""Attention implementation -> cost shape (Pallas flash/splash kernels: blocks in VMEM, masked blocks skipped)."""

DEFAULT_KERNEL_BLOCK = 512


def dtype_bytes(precision: str) -> int:
    """Bytes per element of the compute dtype."""
    return 2 if precision == "bf16" else 4


@dataclass(frozen=True)
class Memory:
    """Predicted bytes per device at the peak of a step."""

    params: float
    grads: float
    optimizer: float
    compute_copy: float
    activations: float
    attention: float
    logits: float

    @property
    def total(self) -> float:
        """Sum of all parts."""
        return (self.params + self.grads + self.optimizer + self.compute_copy + self.activations
                + self.attention + self.logits)

    @property
    def parts(self) -> dict[str, float]:
        """Named parts, grouped as a user reads them: state (params+grads+optimizer), weights, activations."""
        return {"params+grads+optimizer": self.params + self.grads + self.optimizer,
                "gathered weights": self.compute_copy,
                "activations": self.activations + self.attention + self.logits}


@dataclass(frozen=True)
class Estimate:
    """Predicted times (s), memory (bytes/device) and utilisation of one step of a candidate."""

    candidate: Candidate
    compute_s: float  # matmul + attention compute
    hbm_s: float  # HBM-bound work
    comm_s: float  # all collectives, hidden or not
    comm_exposed_s: float  # the part of comm_s on the critical path
    comm_by_axis: dict[str, float]
    step_lower_s: float
    step_upper_s: float
    step_s: float
    memory: Memory
    hbm_bytes: float
    model_flops: float  # per step, whole job (tputool's convention)
    hfu_flops: float  # per step, whole job, as executed (recompute, capacity padding, full causal scores)
    tokens_per_step: int
    n_devices: int
    peak_flops: float  # per device, the fastest matmul precision (bf16 on TPU)
    model_flops_maxtext: float = 0.0  # per step, whole job, causal attention at half
    terms: dict[str, float] = field(default_factory=dict)  # step time by term
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """Predicted peak memory within HBM."""
        return self.memory.total <= self.hbm_bytes

    @property
    def tokens_per_s(self) -> float:
        """Throughput of the whole job."""
        return self.tokens_per_step / self.step_s

    @property
    def tokens_per_s_per_device(self) -> float:
        """Throughput per device (the ranking objective)."""
        return self.tokens_per_s / self.n_devices

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the peak, tputool's convention (causal attention not halved)."""
        return self.model_flops / (self.step_s * self.n_devices * self.peak_flops)

    @property
    def mfu_maxtext(self) -> float:
        """MFU in MaxText's convention (causal attention counted at half)."""
        return (self.model_flops_maxtext or self.model_flops) / (self.step_s * self.n_devices * self.peak_flops)


def mxu_efficiency(dims: list[int], mxu: int) -> float:
    """Fraction of MXU work that is useful when each matmul dim is padded to a multiple of `mxu`."""
    eff = 1.0
    for d in dims:
        if d > 0 and mxu > 1:
            eff *= d / (math.ceil(d / mxu) * mxu)
    return eff


def _activation_bytes_per_token_layer(m: ModelDims, c: Candidate) -> tuple[float, float]:
    """(saved activations, one layer's full activations) bytes per token per layer, excluding attention scores.

    Under tensor parallelism the residual stream is split too (sequence/embed-sharded activations, as
    MaxText's activation_embed rule does): its collectives become reduce-scatter + all-gather pairs.
    """
    b = dtype_bytes(c.precision)
    tp = c.tensor
    qkv = m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim
    ffn = m.ffn_per_token
    full_layer = b * (6 * m.hidden + 3 * qkv + m.heads * m.head_dim + 4 * ffn) / tp
    needed = b * (3 * m.hidden + qkv + m.heads * m.head_dim + 3 * ffn) / tp  # a layer's backward inputs
    if c.remat == "none":
        saved = full_layer
    elif c.remat == "save-dots":
        saved = b * (2 * m.hidden + qkv + 2 * ffn) / tp  # every projection's output
        full_layer = needed
    elif c.remat == "save-qkv":
        saved, full_layer = b * (m.hidden + qkv + m.heads * m.head_dim) / tp, needed
    elif c.remat == "full":
        saved, full_layer = b * m.hidden / tp, needed
    else:  # offload: the layer inputs live in host memory
        saved, full_layer = 0.0, needed + 2 * b * m.hidden / tp  # + the input streaming in and out
    return saved, full_layer


def _elementwise_bytes_per_token_layer(m: ModelDims, c: Candidate) -> float:
    """HBM bytes one forward pass of a layer's memory-bound ops moves per token, on one device."""
    b = dtype_bytes(c.precision)
    hidden = 10 * m.hidden  # two norms (read+write) and two residual adds (2 reads + 1 write)
    rope = 2 * (m.heads + m.kv_heads) * m.head_dim  # q and k rotated (read + write)
    gate = 3 * m.ffn_per_token  # silu(w1 x) * w3 x: 2 reads, 1 write
    moe = 2 * (m.top_k * m.capacity + 1) * m.hidden if m.experts else 0.0  # dispatch and combine copies
    return b * (hidden + rope + gate + moe) / c.tensor


def _kernel(c: Candidate) -> AttentionKernel:
    return ATTENTION_KERNELS.get(c.attention, ATTENTION_KERNELS["chunked"])


def _attention_bytes(m: ModelDims, c: Candidate, local_batch: int) -> tuple[float, float]:
    """(saved for backward over all layers, transient) attention bytes per device."""
    if m.heads == 0 or m.seq <= 1:
        return 0.0, 0.0
    heads = m.heads / c.tensor
    if c.attention == "plain":
        per_layer = local_batch * heads * m.seq * m.seq * 4  # fp32 softmax
        saved = per_layer * m.layers if REMAT_RECOMPUTE[c.remat] == 0 else 0.0
        return saved, per_layer
    if not _kernel(c).scores_in_hbm:  # a flash kernel keeps one row statistic per query
        saved = local_batch * heads * m.seq * 4 * m.layers if REMAT_RECOMPUTE[c.remat] == 0 else 0.0
        return saved, local_batch * heads * m.seq * 4 * 2
    block = min(c.block, m.seq)
    return 0.0, local_batch * heads * block * m.seq * 4


def matmul_recompute(m: ModelDims, remat: str) -> float:
    """Extra forward passes of the layers' matmuls per step under `remat` (save-qkv: the feed-forward's)."""
    if remat != "save-qkv":
        return REMAT_RECOMPUTE[remat]
    attn = m.hidden * m.head_dim * (2 * m.heads + 2 * m.kv_heads)
    ffn = 3 * m.hidden * m.ffn_per_token
    return ffn / (attn + ffn) if attn + ffn else 0.0


def _attention_flops_executed(m: ModelDims, c: Candidate, recompute: float) -> float:
    """Attention FLOPs per token as the chosen kernel executes them (whole job, per token)."""
    if not m.heads or m.seq <= 1:
        return 0.0
    k = _kernel(c)
    full = m.attention_flops_per_token
    frac = 1.0
    if k.causal_skip and m.causal:
        block = c.block or DEFAULT_KERNEL_BLOCK
        frac = 0.5 + min(block, m.seq) / (2 * m.seq)  # diagonal blocks are computed whole
    # a forward is 1/3 of the 12 L T H Q; the kernel's own and remat's recomputed forwards add to it
    return full * frac * (1.0 + (k.bwd_recompute + recompute) / 3.0)


def estimate(model: ModelDims, c: Candidate, hw: Hardware, params_per_device: float | None = None) -> Estimate:
    """Predict one training step of `model` under candidate `c` on `hw`.

    `params_per_device` is the parameter count a device holds under the candidate's partition rules;
    by default every parameter is taken as sharded over fsdp x tensor.
    """
    notes: list[str] = []
    model = dispatched(model, c)
    eff = hw.eff
    n = c.n_devices
    b = dtype_bytes(c.precision)
    local_batch = c.batch  # sequences per data-parallel shard, shared by its tensor devices
    tokens_step = c.global_batch * model.seq
    tokens_dev = tokens_step / n  # each device's share of the matmul work
    tokens_shard = local_batch * model.seq  # tokens a device holds activations for
    layers = max(model.layers, 1)
    p_local = params_per_device if params_per_device is not None else model.params / (c.fsdp * c.tensor)
    p_compute = model.params / c.tensor  # weights a device touches per step after fsdp all-gathers
    state = model.state_bytes_per_param
    grad_bytes = state / 4

    # compute: matmuls and attention at their achievable fractions of peak
    recompute = matmul_recompute(model, c.remat)
    attn_recompute = REMAT_RECOMPUTE[c.remat]
    expert_extra = 0.0
    if model.experts:
        active_experts = model.expert_params * model.top_k / model.experts
        expert_extra = active_experts * (model.capacity - 1.0)
    mm_per_token = 6.0 * (model.active_matmul_params + expert_extra) * (1 + recompute / 3)
    if model.flops_per_token_override is not None:
        mm_per_token = model.flops_per_token_override * (1 + recompute / 3)
    attn_per_token = _attention_flops_executed(model, c, attn_recompute) if model.flops_per_token_override is None \
        else 0.0
    peak = hw.matmul_flops[c.precision]
    mxu = mxu_efficiency([model.hidden, model.ffn // c.tensor, model.heads * model.head_dim // c.tensor], hw.mxu)
    mxu_attn = mxu_efficiency([model.head_dim], hw.mxu)  # QK^T contracts over head_dim
    if mxu < 0.999:
        notes.append(f"MXU padding wastes {100 * (1 - mxu):.0f}% of matmul work")
    if mxu_attn < 0.999 and model.heads:
        notes.append(f"head_dim {model.head_dim} fills {100 * mxu_attn:.0f}% of the {hw.mxu}-wide MXU in attention")
    mm_s = tokens_dev * mm_per_token / (peak * eff.matmul * mxu)
    weight_s = p_compute * b * (3 + recompute) / (hw.hbm_bw * eff.hbm)  # weights streamed per matmul pass
    if weight_s > mm_s:
        notes.append("matmuls are HBM-bound at this batch (weights are re-read faster than they are used)")
        mm_s = weight_s
    attn_s = tokens_dev * attn_per_token / (peak * eff.attention * mxu_attn)
    compute_s = mm_s + attn_s

    # HBM-bound work
    elem_passes = 3 + REMAT_ELEMENTWISE_RECOMPUTE[c.remat]  # forward, backward (2x), recompute
    elem_bytes = tokens_shard * _elementwise_bytes_per_token_layer(model, c) * elem_passes * layers \
        if model.layers else 0.0
    score_bytes = 0.0
    if model.heads and model.seq > 1 and _kernel(c).scores_in_hbm:
        passes = SCORE_PASSES.get(c.attention, SCORE_PASSES["chunked"]) + 4.0 * REMAT_RECOMPUTE[c.remat]
        score_bytes = local_batch * (model.heads / c.tensor) * model.seq**2 * 4 * passes * layers
    logits_mem = tokens_shard * (model.vocab / c.tensor) * b if model.vocab else 0.0  # grad in place
    logit_bytes = 6 * logits_mem  # write, softmax read/write, backward read/write
    optimizer_s = p_local * state * OPTIMIZER_TRAFFIC / (hw.hbm_bw * eff.hbm)
    elementwise_s = (elem_bytes + score_bytes + logit_bytes) / (hw.hbm_bw * eff.hbm)
    hbm_s = elementwise_s + optimizer_s

    # memory
    saved_tok, full_tok = _activation_bytes_per_token_layer(model, c)
    acts = tokens_shard * (saved_tok * layers + (full_tok if c.remat != "none" else 0.0))
    attn_saved, attn_transient = _attention_bytes(model, c, local_batch)
    fp32_weights = state >= 16
    master_copy = p_local * b if fp32_weights and b < 4 else 0.0  # the compute-dtype copy of fp32 weights
    gathered = (p_compute / layers) * b * GATHERED_LAYERS_IN_FLIGHT if c.fsdp > 1 else 0.0
    mem = Memory(params=p_local * state / 4, grads=p_local * grad_bytes, optimizer=p_local * state / 2,
                 compute_copy=master_copy + gathered, activations=acts, attention=attn_saved + attn_transient,
                 logits=logits_mem)

    # collectives, per layer, and how much of each hides under compute
    mesh = c.mesh
    busy_s = compute_s + elementwise_s
    fwd_share = 1.0 / (3.0 + recompute)
    fwd_layer, bwd_layer = busy_s * fwd_share / layers, busy_s * (1 - fwd_share) / layers
    comm: dict[str, float] = {}
    exposed: dict[str, float] = {}
    if c.fsdp > 1:
        v = p_compute / layers * b
        ag = hw.collective_s(mesh, "fsdp", "all-gather", v)
        rs = hw.collective_s(mesh, "fsdp", "reduce-scatter", v * grad_bytes / b)
        comm["fsdp"] = layers * (2 * ag + rs)
        exposed["fsdp"] = layers * (max(0.0, ag - fwd_layer) + max(0.0, ag + rs - bwd_layer)) + ag
    if c.tensor > 1:
        v = tokens_shard * model.hidden * b
        count = (4 + 2 * recompute) * layers
        comm["tensor"] = count * hw.collective_s(mesh, "tensor", "all-reduce", v)
        exposed["tensor"] = comm["tensor"]
    if c.data > 1:
        dp = hw.collective_s(mesh, "data", "all-reduce", p_local * grad_bytes)
        comm["data"] = dp
        exposed["data"] = max(0.0, dp - busy_s * (1 - fwd_share)) + dp / layers
    if c.remat == "offload" and hw.host_bw > 0:  # layer inputs to host in the forward, back in the backward
        per_layer = tokens_shard * model.hidden * b / c.tensor / hw.host_bw
        comm["host"] = 2 * per_layer * layers
        exposed["host"] = layers * (max(0.0, per_layer - fwd_layer) + max(0.0, per_layer - bwd_layer))
    comm_s = sum(comm.values())
    exposed_s = min(sum(exposed.values()), comm_s)
    exposed_s += eff.overlap_cost * (comm_s - exposed_s)  # hidden collectives still contend for HBM
    fixed = hw.step_overhead_s
    lower = max(compute_s, hbm_s, comm_s) + fixed
    upper = compute_s + hbm_s + comm_s + fixed
    point = min(max(compute_s + hbm_s + exposed_s + fixed, lower), upper)
    hfu = (mm_per_token + attn_per_token) * tokens_step
    terms = {"matmul": mm_s, "attention": attn_s, "hbm-bound ops": elementwise_s, "optimizer": optimizer_s,
             "exposed collectives": exposed_s, "fixed": fixed}
    return Estimate(
        candidate=c, compute_s=compute_s, hbm_s=hbm_s, comm_s=comm_s, comm_exposed_s=exposed_s,
        comm_by_axis=comm, step_lower_s=lower, step_upper_s=upper, step_s=point, memory=mem,
        hbm_bytes=hw.hbm_bytes, model_flops=model.flops_per_token * tokens_step, hfu_flops=hfu,
        tokens_per_step=tokens_step, n_devices=n, peak_flops=max(hw.matmul_flops.values()),
        model_flops_maxtext=model.flops_per_token_maxtext * tokens_step, terms=terms, notes=notes,
    )


def hlo_flops(compiled) -> float | None:
    """FLOPs XLA's cost_analysis reports for a compiled executable (a while/scan body counts once)."""
    try:
        ca = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if isinstance(ca, list):
        ca = ca[0] if ca else None
    if not ca or "flops" not in ca:
        return None
    return float(ca["flops"])


def program_seconds(flops: float, bytes_accessed: float, hw: Hardware, precision: str = "bf16") -> float:
    """A lower bound on a compiled program's time on one device of `hw`: its FLOPs at the calibrated matmul
    rate or its HBM traffic at the calibrated bandwidth (XLA's cost analysis), whichever is longer, plus the
    calibrated fixed cost of a step (`tputool diagnose --target`'s step_seconds)."""
    compute = flops / (hw.matmul_flops[precision] * hw.eff.matmul)
    memory = bytes_accessed / (hw.hbm_bw * hw.eff.hbm)
    return max(compute, memory) + hw.step_overhead_s
