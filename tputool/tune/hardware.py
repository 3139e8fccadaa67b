"""The machine a cost model predicts for: a TPU slice from the spec table, or the host CPU calibrated."""

from __future__ import annotations

from dataclasses import dataclass, field

from tputool.errors import UserError
from tputool.tune.slices import Slice, chip_by_name, mesh_axis_bandwidth, parse_target
from tputool.tune.specs import DEFAULT_TOPOLOGIES

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


def tpu_hardware(target: str | Slice) -> Hardware:
    """Hardware for a TPU target such as `v5e-256` or `v6e:2x4`, from the spec table."""
    sl = parse_target(target) if isinstance(target, str) else target
    chip = sl.chip
    return Hardware(
        name=sl.name, n_devices=sl.n_devices,
        matmul_flops={"bf16": chip.peak_bf16_flops, "fp32": chip.peak_bf16_flops / FP32_MATMUL_PASSES},
        hbm_bytes=chip.hbm_bytes, hbm_bw=chip.hbm_bw, link_bw=2 * chip.ici_bw_per_link,
        collective_latency_s=chip.ici_latency_s, mxu=chip.mxu, kind="tpu", slice=sl,
    )


def tpu_hardware_for_devices(devices: list) -> Hardware:
    """Hardware for the TPU devices this process sees (generation from device_kind, standard slice shape)."""
    chip = chip_by_name(devices[0].device_kind)
    n_chips = max(1, len(devices) // chip.devices_per_chip)
    topo = DEFAULT_TOPOLOGIES[chip.torus_dims].get(n_chips)
    if topo is None:
        raise UserError(f"{len(devices)} {chip.name} devices do not form a standard slice")
    return tpu_hardware(Slice(chip, topo))
