"""Roofline cost model of one training step (forward, backward, AdamW update) for a Candidate.

Conventions, stated once:
- Model FLOPs per token = 6 x matmul params + 12 x layers x seq x heads x head_dim (PaLM/torchtitan;
  causal masking is not halved). MFU uses model FLOPs; remat recompute only counts in HFU.
- Master weights, gradients of the master and AdamW moments are fp32 (16 bytes/param), sharded by the
  candidate's partition rules; the compute copy is in the candidate's precision.
- Collectives are rings: all-gather / reduce-scatter of V bytes over n devices cost V(n-1)/n / W,
  all-reduce 2V(n-1)/n / W, plus latency. fsdp and data collectives overlap with compute; tensor-
  parallel all-reduces sit on the critical path. The step lies in [max(compute, hbm, comm),
  max(compute, hbm) + comm]; the point estimate is max(compute, hbm, overlapped) + exposed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.hardware import Hardware

REMAT_RECOMPUTE = {"none": 0.0, "save-dots": 0.0, "full": 1.0}
"""Extra forward passes of the layers per step (save-dots recomputes only elementwise work)."""

OPTIMIZER_BYTES_PER_PARAM = 16
"""fp32 master weight + fp32 gradient + two fp32 AdamW moments."""

OPTIMIZER_TRAFFIC_PER_PARAM = 28
"""HBM bytes an AdamW update moves per local parameter (read 16, write 12)."""


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


@dataclass(frozen=True)
class Estimate:
    """Predicted times (s), memory (bytes/device) and utilisation of one step of a candidate."""

    candidate: Candidate
    compute_s: float
    hbm_s: float
    comm_s: float
    comm_exposed_s: float
    comm_by_axis: dict[str, float]
    step_lower_s: float
    step_upper_s: float
    step_s: float
    memory: Memory
    hbm_bytes: float
    model_flops: float  # per step, whole job
    hfu_flops: float  # per step, whole job, with recompute
    tokens_per_step: int
    n_devices: int
    peak_flops: float  # per device, the fastest matmul precision (bf16 on TPU)
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
        """Model FLOPs utilisation against the peak (bf16 on TPU)."""
        return self.model_flops / (self.step_s * self.n_devices * self.peak_flops)


def mxu_efficiency(dims: list[int], mxu: int) -> float:
    """Fraction of MXU work that is useful when each matmul dim is padded to a multiple of `mxu`."""
    eff = 1.0
    for d in dims:
        if d > 0 and mxu > 1:
            eff *= d / (math.ceil(d / mxu) * mxu)
    return eff


def _activation_bytes_per_token_layer(m: ModelDims, c: Candidate) -> tuple[float, float]:
    """(saved activations, one layer's full activations) bytes per token per layer, excluding attention scores."""
    b = dtype_bytes(c.precision)
    tp = c.tensor
    qkv = m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim
    full_layer = b * (6 * m.hidden + (3 * qkv + m.heads * m.head_dim + 4 * m.ffn) / tp)
    if c.remat == "none":
        saved = full_layer
    elif c.remat == "save-dots":
        saved = b * (2 * m.hidden + (qkv + m.heads * m.head_dim + 2 * m.ffn) / tp)
    else:
        saved = b * m.hidden
    return saved, full_layer


def _attention_bytes(m: ModelDims, c: Candidate, local_batch: int) -> tuple[float, float]:
    """(saved for backward over all layers, transient) attention-score bytes per device."""
    if m.heads == 0 or m.seq <= 1:
        return 0.0, 0.0
    heads = m.heads / c.tensor
    if c.attention == "plain":
        per_layer = local_batch * heads * m.seq * m.seq * 4  # fp32 softmax
        saved = per_layer * m.layers if c.remat != "full" else 0.0
        return saved, per_layer
    block = min(c.block, m.seq)
    return 0.0, local_batch * heads * block * m.seq * 4


def estimate(model: ModelDims, c: Candidate, hw: Hardware, params_per_device: float | None = None) -> Estimate:
    """Predict one training step of `model` under candidate `c` on `hw`.

    `params_per_device` is the parameter count a device holds under the candidate's partition rules;
    by default every parameter is taken as sharded over fsdp x tensor.
    """
    notes: list[str] = []
    n = c.n_devices
    b = dtype_bytes(c.precision)
    local_batch = c.batch  # sequences per data-parallel shard, shared by its tensor devices
    tokens_step = c.global_batch * model.seq
    p_local = params_per_device if params_per_device is not None else model.params / (c.fsdp * c.tensor)
    p_compute = model.params / c.tensor  # weights a device touches per step after fsdp all-gathers

    # compute
    model_flops = model.flops_per_token * tokens_step
    recompute = REMAT_RECOMPUTE[c.remat]
    hfu = model_flops * (1 + recompute / 3)
    if c.attention == "chunked" and c.remat != "full":
        hfu += model.attention_flops_per_token / 3 * tokens_step  # per-block forward recomputed in backward
    eff = mxu_efficiency([model.hidden, model.ffn // max(c.tensor, 1), model.head_dim], hw.mxu)
    if eff < 0.999:
        notes.append(f"MXU padding wastes {100 * (1 - eff):.0f}% of matmul work")
    compute_s = hfu / n / (hw.matmul_flops[c.precision] * eff)

    # memory
    saved_tok, full_tok = _activation_bytes_per_token_layer(model, c)
    local_tokens = local_batch * model.seq
    layers = max(model.layers, 1)
    acts = local_tokens * (saved_tok * layers + (full_tok if c.remat == "full" else 0.0))
    attn_saved, attn_transient = _attention_bytes(model, c, local_batch)
    logits = local_tokens * (model.vocab / c.tensor) * 4 * 2 if model.vocab else 0.0
    compute_copy = p_local * b + (p_compute / layers) * b * (2 if c.fsdp > 1 else 0)
    mem = Memory(params=p_local * 4, grads=p_local * 4, optimizer=p_local * 8, compute_copy=compute_copy,
                 activations=acts, attention=attn_saved + attn_transient, logits=logits)

    # HBM traffic
    weight_reads = p_compute * b * (3 + recompute)
    act_traffic = 2 * local_tokens * full_tok * layers * (1 + recompute)
    attn_traffic = 0.0
    if model.heads and model.seq > 1:
        attn_traffic = local_batch * (model.heads / c.tensor) * model.seq**2 * 4 * 6 * layers
    hbm_s = (weight_reads + act_traffic + attn_traffic + logits * 2
             + p_local * OPTIMIZER_TRAFFIC_PER_PARAM) / hw.hbm_bw

    # collectives
    mesh = c.mesh
    comm: dict[str, float] = {}
    if c.fsdp > 1:
        v = p_compute * b
        passes = 3 + recompute  # gather fwd, gather bwd (+ recompute), reduce-scatter grads
        w = hw.axis_bandwidth(mesh, "fsdp")
        comm["fsdp"] = passes * v * (c.fsdp - 1) / c.fsdp / w + passes * layers * hw.latency(c.fsdp)
    if c.data > 1:
        v = p_local * b
        w = hw.axis_bandwidth(mesh, "data")
        comm["data"] = 2 * v * (c.data - 1) / c.data / w + layers * hw.latency(c.data)
    if c.tensor > 1:
        v = local_tokens * model.hidden * b
        count = (4 + 2 * recompute) * layers
        w = hw.axis_bandwidth(mesh, "tensor")
        comm["tensor"] = count * (2 * v * (c.tensor - 1) / c.tensor / w + hw.latency(c.tensor))
    comm_s = sum(comm.values())
    exposed = comm.get("tensor", 0.0)
    overlapped = comm_s - exposed
    base = max(compute_s, hbm_s)
    lower = max(base, comm_s) + hw.step_overhead_s
    upper = base + comm_s + hw.step_overhead_s
    point = min(max(max(base, overlapped) + exposed + hw.step_overhead_s, lower), upper)
    return Estimate(
        candidate=c, compute_s=compute_s, hbm_s=hbm_s, comm_s=comm_s, comm_exposed_s=exposed,
        comm_by_axis=comm, step_lower_s=lower, step_upper_s=upper, step_s=point, memory=mem,
        hbm_bytes=hw.hbm_bytes, model_flops=model_flops, hfu_flops=hfu, tokens_per_step=tokens_step,
        n_devices=n, peak_flops=max(hw.matmul_flops.values()), notes=notes,
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
