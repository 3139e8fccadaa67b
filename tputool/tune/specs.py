"""Per-chip TPU numbers for the cost model, kept as data (source: shared/reference/tpu-tuning.md).

HBM is what a program may use: v5e 15.75 GiB and v6e 31.25 GiB are the `bytes_limit` JAX's
memory_stats reports on those chips (16 and 32 GiB stacks, less what the runtime keeps). The DCN and host (PCIe) bandwidths are assumptions (a data-center NIC share per chip), not a published
figure; multi-slice collectives are priced with it and `tune --calibrate` can refit it.

Figures are per JAX device: on v7x one chip is two JAX devices, so its per-chip peak, HBM and HBM
bandwidth are halved here. ICI bandwidth is one-way per link.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
GB = 1000**3


@dataclass(frozen=True)
class ChipSpec:
    """One TPU generation, per JAX device."""

    name: str  # tputool's short name: v4, v5e, v5p, v6e, v7x
    device_kind: str  # what jax.devices()[0].device_kind reports
    peak_bf16_flops: float  # FLOP/s per device
    hbm_bytes: float  # per device
    hbm_bw: float  # B/s per device
    ici_bw_per_link: float  # B/s one-way per link
    torus_dims: int  # 2 or 3
    devices_per_chip: int
    mxu: int  # systolic array edge: pad matmul dims to a multiple of this
    max_chips: int  # largest ICI-connected slice (a pod)
    topology_prefix: str  # prefix of jax.experimental.topologies names, e.g. "v5e" in "v5e:2x4"
    name_counts_cores: bool  # True when "v4-8" counts TensorCores (2 per chip), False when it counts chips
    wraparound_multiple: int  # a torus dim has wraparound links when its size is a multiple of this
    ici_latency_s: float = 1e-6  # per hop
    dcn_bw_per_chip: float = 6.25e9  # B/s between slices (multi-slice), per chip: 200 Gb/s per 4-chip host
    host_bw_per_chip: float = 16e9  # B/s to host memory (PCIe), per chip: what host offload streams over
    gke_accelerator: str = ""  # GKE node label cloud.google.com/gke-tpu-accelerator
    machine_family: str = ""  # GKE/GCE machine type less its "-<chips per host>t" suffix
    single_host_chips: tuple[int, ...] = (4,)  # slice sizes (chips) one host holds whole; larger: 4 per host
    cloud_prefix: str = ""  # Cloud TPU / xpk accelerator-type prefix when not `name` (v5litepod, tpu7x)
    note: str = ""


CHIPS: dict[str, ChipSpec] = {
    "v4": ChipSpec("v4", "TPU v4", 275e12, 32 * GIB, 1200e9, 4.5e10, 3, 1, 128, 4096, "v4", True, 4,
                   gke_accelerator="tpu-v4-podslice", machine_family="ct4p-hightpu"),
    "v5e": ChipSpec("v5e", "TPU v5 lite", 197e12, 15.75 * GIB, 819e9, 4.5e10, 2, 1, 128, 256, "v5e", False, 16,
                    gke_accelerator="tpu-v5-lite-podslice", machine_family="ct5lp-hightpu",
                    single_host_chips=(1, 4, 8), cloud_prefix="v5litepod"),
    "v5p": ChipSpec("v5p", "TPU v5", 459e12, 95 * GIB, 2765e9, 9e10, 3, 1, 128, 8960, "v5p", True, 4,
                    gke_accelerator="tpu-v5p-slice", machine_family="ct5p-hightpu"),
    "v6e": ChipSpec("v6e", "TPU v6 lite", 918e12, 31.25 * GIB, 1638e9, 9e10, 2, 1, 256, 256, "v6e", False, 16,
                    gke_accelerator="tpu-v6e-slice", machine_family="ct6e-standard", single_host_chips=(1, 4, 8)),
    "v7x": ChipSpec(
        "v7x", "TPU7x", 2307e12 / 2, 192 * GIB / 2, 7.4e12 / 2, 1e11, 3, 2, 256, 9216, "tpu7x", True, 4,
        gke_accelerator="tpu7x", machine_family="tpu7x-standard", single_host_chips=(1, 4), cloud_prefix="tpu7x",
        note="HBM bandwidth from secondary sources, ICI bandwidth derived and unverified",
    ),
}
"""Short name -> ChipSpec. Hosts (GKE node pools, xpk's system_characteristics.py, Cloud TPU VMs): a slice of
`single_host_chips` chips is one host with all of them; a larger one has 4 chips per host (machine type
`<machine_family>-4t`), so hosts = chips / 4."""

ALIASES: dict[str, str] = {
    "tpu7x": "v7x", "ironwood": "v7x", "trillium": "v6e", "v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e",
}
"""Other spellings users type for a generation."""

DEFAULT_TOPOLOGIES: dict[int, dict[int, tuple[int, ...]]] = {
    2: {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
        256: (16, 16)},
    3: {1: (1, 1, 1), 2: (1, 1, 2), 4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
        128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16),
        4096: (16, 16, 16)},
}
"""Torus dims -> chip count -> the slice shape Cloud TPU gives for that count (chips per torus dim)."""
