"""The machine a cost model predicts for: a TPU slice from the spec table, or the host CPU calibrated."""

from __future__ import annotations

from dataclasses import dataclass, field

from tputool.errors import UserError
from tputool.tune.efficiency import Efficiency, load_calibration
from tputool.tune.slices import Slice, chip_by_name, dcn_part, mesh_axis_bandwidth, parse_target
from tputool.tune.specs import DEFAULT_TOPOLOGIES

DCN_LATENCY_S = 20e-6
"""Latency of one collective step across slices."""

_RING_PASSES = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "all-to-all": 1.0}
"""Ring passes over the data per collective kind (all-reduce = reduce-scatter + all-gather)."""

FP32_MATMUL_PASSES = 6
"""On TPU an fp32 matmul at HIGHEST precision runs as 6 bf16 MXU passes (JAX's bf16_6x)."""


@dataclass(frozen=True)
class Hardware:
    """Per-device rates of a machine. `slice` is set for TPUs (collective bandwidth follows the torus)."""

    name: str
    n_devices: int
    matmul_flops: dict[str, float]  # precision -> FLOP/s per device
    hbm_bytes: float
    hbm_bw: float
    link_bw: float  # bidirectional ring bandwidth per mesh axis when there is no slice
    collective_latency_s: float  # per collective, per device hop count n/2 is applied on top for TPUs
    step_overhead_s: float = 0.0
    mxu: int = 1
    kind: str = "tpu"  # "tpu" (estimated from specs) or "cpu" (calibrated on this host)
    slice: Slice | None = field(default=None, compare=False)
    eff: Efficiency = field(default_factory=Efficiency)  # achievable fractions of the peaks above
    dcn_bw: float = 0.0  # B/s per device across slices
    host_bw: float = 0.0  # B/s per device to host memory (remat offload)

    def collective_s(self, mesh: dict[str, int], axis: str, kind: str, nbytes: float) -> float:
        """Time of one ring collective of `nbytes` (the full, gathered size) over mesh `axis`.

        The part of the axis inside a slice runs at ICI ring bandwidth; the part across slices
        (multi-slice) moves 1/ici_size of the data over DCN, hierarchically after the ICI step.
        """
        n = mesh.get(axis, 1)
        if n <= 1 or nbytes <= 0:
            return 0.0
        passes = _RING_PASSES[kind]
        if self.slice is None:
            return passes * nbytes * (n - 1) / n / (self.link_bw * self.eff.ici) + self.latency(n)
        s = dcn_part(self.slice, mesh, axis)
        a = n // s
        t = 0.0
        if a > 1:
            w = mesh_axis_bandwidth(self.slice, mesh, axis)[0] * self.eff.ici
            t += passes * nbytes * (a - 1) / a / w + self.latency(a)
        if s > 1:
            t += passes * (nbytes / a) * (s - 1) / s / (self.dcn_bw * self.eff.dcn) + DCN_LATENCY_S * (s - 1)
        return t

    def axis_bandwidth(self, mesh: dict[str, int], axis: str) -> float:
        """Bidirectional ring bandwidth (B/s) of mesh `axis`."""
        if self.slice is None:
            return self.link_bw
        return mesh_axis_bandwidth(self.slice, mesh, axis)[0]

    def latency(self, n: int) -> float:
        """Latency of one ring collective over `n` devices."""
        if n <= 1:
            return 0.0
        if self.slice is None:
            return self.collective_latency_s
        return self.collective_latency_s * n / 2


def tpu_hardware(target: str | Slice, calibration: str | None = None,
                 efficiency: Efficiency | None = None) -> Hardware:
    """Hardware for a TPU target such as `v5e-256`, `v6e:2x4` or `v5e-256x2`, from the spec table.

    The achievable fractions come from `efficiency`, else the `calibration` YAML (default: the shipped
    fit on published runs); a chip the calibration does not name takes its `default` entry (else its
    peaks: a roofline).
    """
    sl = parse_target(target) if isinstance(target, str) else target
    chip = sl.chip
    if efficiency is None:
        chips = load_calibration(calibration)
        efficiency = chips.get(chip.name, chips.get("default", Efficiency()))
    return Hardware(
        name=sl.name, n_devices=sl.n_devices,
        matmul_flops={"bf16": chip.peak_bf16_flops, "fp32": chip.peak_bf16_flops / FP32_MATMUL_PASSES},
        hbm_bytes=chip.hbm_bytes, hbm_bw=chip.hbm_bw, link_bw=2 * chip.ici_bw_per_link,
        collective_latency_s=chip.ici_latency_s, step_overhead_s=efficiency.step_fixed_s, mxu=chip.mxu,
        kind="tpu", slice=sl, eff=efficiency, dcn_bw=chip.dcn_bw_per_chip / chip.devices_per_chip,
        host_bw=chip.host_bw_per_chip / chip.devices_per_chip,
    )


def tpu_hardware_for_devices(devices: list) -> Hardware:
    """Hardware for the TPU devices this process sees (generation from device_kind, standard slice shape)."""
    chip = chip_by_name(devices[0].device_kind)
    n_chips = max(1, len(devices) // chip.devices_per_chip)
    topo = DEFAULT_TOPOLOGIES[chip.torus_dims].get(n_chips)
    if topo is None:
        raise UserError(f"{len(devices)} {chip.name} devices do not form a standard slice")
    return tpu_hardware(Slice(chip, topo))
