"""Parse a TPU target (`v5e-256`, `v6e-8`, `v7x-128`, `v5e:2x4`, `tpu7x:2x2x1`, and `v5e-256x2` for two
slices joined by the data-center network) into a `Slice`."""

from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import dataclass

from tputool.errors import UserError
from tputool.tune.specs import ALIASES, CHIPS, DEFAULT_TOPOLOGIES, ChipSpec


@dataclass(frozen=True)
class Slice:
    """A TPU slice: the chip generation, its torus shape in chips, and the JAX device count."""

    chip: ChipSpec
    topology: tuple[int, ...]  # chips per torus dim, of one slice
    slices: int = 1  # ICI slices joined by DCN (multi-slice)

    @property
    def n_chips(self) -> int:
        """Chips in all slices."""
        return math.prod(self.topology) * self.slices

    @property
    def n_devices(self) -> int:
        """JAX devices in the slice (two per chip on v7x)."""
        return self.n_chips * self.chip.devices_per_chip

    @property
    def topology_name(self) -> str:
        """The name `jax.experimental.topologies.get_topology_desc` takes, e.g. `v5e:2x4`."""
        return f"{self.chip.topology_prefix}:{'x'.join(map(str, self.topology))}"

    @property
    def name(self) -> str:
        """The accelerator-type spelling, e.g. `v5e-8` (v4/v5p/v7x count TensorCores, v5e/v6e chips)."""
        per_slice = math.prod(self.topology)
        count = per_slice * 2 if self.chip.name_counts_cores else per_slice
        return f"{self.chip.name}-{count}" + (f"x{self.slices}" if self.slices > 1 else "")

    @property
    def cloud_name(self) -> str:
        """One slice's name as gcloud, xpk and TPU_ACCELERATOR_TYPE spell it, e.g. `v5litepod-16`, `tpu7x-8`."""
        return (self.chip.cloud_prefix or self.chip.name) + "-" + Slice(self.chip, self.topology).name.split("-")[1]

    @property
    def chips_per_slice(self) -> int:
        """Chips in one slice."""
        return math.prod(self.topology)

    @property
    def tensorcores_per_chip(self) -> int:
        """TensorCores per chip: 2 on v4/v5p (one JAX device, megacore) and v7x (two devices), else 1."""
        return 2 if self.chip.name_counts_cores else 1

    @property
    def chips_per_host(self) -> int:
        """Chips one host (TPU VM, GKE node) of the slice holds."""
        return self.chips_per_slice if self.chips_per_slice in self.chip.single_host_chips else 4

    @property
    def hosts(self) -> int:
        """Hosts per slice (a multi-slice job has `hosts * slices` hosts)."""
        return self.chips_per_slice // self.chips_per_host

    @property
    def gke_topology(self) -> str:
        """The `cloud.google.com/gke-tpu-topology` node label, e.g. `4x4` or `2x2x4`."""
        return "x".join(map(str, self.topology))

    @property
    def machine_type(self) -> str:
        """The GKE/GCE machine type of one host, e.g. `ct5lp-hightpu-4t`."""
        return f"{self.chip.machine_family}-{self.chips_per_host}t"

    @property
    def hbm_bytes_per_chip(self) -> float:
        """HBM per chip (usable bytes, as the cost model counts them)."""
        return self.chip.hbm_bytes * self.chip.devices_per_chip

    def check_hosts(self) -> None:
        """UserError when no TPU host holds this shape (e.g. a 2-chip v5p slice, or 6 chips on 4-chip hosts)."""
        n = self.chips_per_slice
        if n not in self.chip.single_host_chips and (n % 4 or n < 4):
            sizes = ", ".join(Slice(self.chip, DEFAULT_TOPOLOGIES[self.chip.torus_dims][c]).name
                              for c in self.chip.single_host_chips)
            raise UserError(f"no {self.chip.name} host holds a {self.name} slice (single-host sizes: {sizes}; "
                            "larger slices have 4 chips per host)")

    def wraparound(self, dim: int) -> bool:
        """Whether torus dim `dim` has wraparound links (a full ring) at its size."""
        size = self.topology[dim]
        return size > 2 and size % self.chip.wraparound_multiple == 0


def chip_by_name(name: str) -> ChipSpec:
    """The ChipSpec for `v5e`, `TPU v5 lite`, `tpu7x`, ...; an unknown name is a UserError."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in CHIPS:
        return CHIPS[key]
    for chip in CHIPS.values():
        if chip.device_kind.lower() == key:
            return chip
    raise UserError(f"unknown TPU generation '{name}' (known: {', '.join(CHIPS)})")


def known_targets() -> list[str]:
    """Every standard slice name, as tune writes it (`v5e-16`) and as Cloud TPU does (`v5litepod-16`,
    `tpu7x-8`)."""
    names = []
    for chip in CHIPS.values():
        spellings = [chip.name] + [a for a, c in ALIASES.items() if c == chip.name and a in ("tpu7x", "v5litepod")]
        for c in DEFAULT_TOPOLOGIES[chip.torus_dims]:
            if c <= chip.max_chips:
                count = c * 2 if chip.name_counts_cores else c
                names += [f"{s}-{count}" for s in spellings]
    return names


def _near(text: str) -> str:
    near = difflib.get_close_matches(text, known_targets(), n=6, cutoff=0.6)
    return f" (did you mean: {', '.join(near)}?)" if near else " (e.g. v5e-16, v5p-32, v6e-256, tpu7x-8, v5e-256x2)"


_ACCEL = re.compile(r"^([a-z0-9]+?)(?:pod)?-(\d+)$")
_TOPO = re.compile(r"^([a-z0-9 ]+):(\d+(?:x\d+)+)$")
_SLICES = re.compile(r"^(.*-\d+)x(\d+)$")


def parse_target(target: str) -> Slice:
    """`v5e-256` / `v6e-8` / `v7x-128` / `v5e:2x4` / `tpu7x:2x2x1` -> Slice; anything else is a UserError."""
    text = target.strip().lower()
    if (m := _SLICES.match(text)) and int(m.group(2)) > 1:
        one = parse_target(m.group(1))
        return Slice(one.chip, one.topology, int(m.group(2)))
    if m := _TOPO.match(text):
        chip = chip_by_name(m.group(1))
        dims = tuple(int(d) for d in m.group(2).split("x"))
        if len(dims) != chip.torus_dims and not (chip.torus_dims == 3 and len(dims) == 2):
            raise UserError(f"{chip.name} is a {chip.torus_dims}D torus; topology '{m.group(2)}' has {len(dims)} dims")
        if chip.torus_dims == 3 and len(dims) == 2:
            dims = (*dims, 1)
        if min(dims) < 1 or math.prod(dims) > chip.max_chips:
            raise UserError(f"topology {m.group(2)} is outside a {chip.name} pod ({chip.max_chips} chips)")
        return Slice(chip, dims)
    if m := _ACCEL.match(text):
        try:
            chip = chip_by_name(m.group(1))
        except UserError:
            raise UserError(f"unknown TPU generation '{m.group(1)}' in '{target}'" + _near(text)) from None
        count = int(m.group(2))
        if chip.name_counts_cores:
            if count % 2:
                raise UserError(f"{chip.name}-N counts TensorCores (2 per chip): N must be even, got {count}")
            chips = count // 2
        else:
            chips = count
        shapes = DEFAULT_TOPOLOGIES[chip.torus_dims]
        if chips not in shapes or chips > chip.max_chips:
            sizes = ", ".join(f"{chip.name}-{c * 2 if chip.name_counts_cores else c}" for c in shapes
                              if c <= chip.max_chips)
            raise UserError(f"no standard {chip.name} slice with {chips} chips (try one of: {sizes})")
        return Slice(chip, shapes[chips])
    raise UserError(f"bad TPU target '{target}'" + _near(text))


def axis_spans(slice_: Slice, axis_sizes: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
    """Mesh axis -> [(torus dim, devices along it)]; dim -1 is within a chip, dim -2 the slices (DCN).

    Axes are laid onto torus dims in order (the innermost, last axis first, as device meshes do); the
    slices come last, so only the outermost axes cross the data-center network.
    """
    return _axis_spans(slice_, tuple(axis_sizes.items()))


@functools.lru_cache(maxsize=4096)
def _axis_spans(slice_: Slice, items: tuple[tuple[str, int], ...]) -> dict[str, list[tuple[int, int]]]:
    axis_sizes = dict(items)
    remaining = [slice_.slices, *slice_.topology, slice_.chip.devices_per_chip]
    dims_index = [-2, *range(len(slice_.topology)), -1]
    spans: dict[str, list[tuple[int, int]]] = {}
    for name in reversed(list(axis_sizes)):
        need = axis_sizes[name]
        spans[name] = []
        i = len(remaining) - 1
        while need > 1 and i >= 0:
            if remaining[i] > 1:
                take = math.gcd(need, remaining[i])
                if take > 1:
                    spans[name].append((dims_index[i], take))
                    remaining[i] //= take
                    need //= take
            i -= 1
    return spans


def mesh_axis_bandwidth(slice_: Slice, axis_sizes: dict[str, int], axis: str) -> tuple[float, int]:
    """(bidirectional ring bandwidth B/s over ICI, number of torus dims spanned) for logical mesh `axis`.

    An axis spanning k torus dims gets k rings; a dim without wraparound links halves its bandwidth.
    The part of an axis that crosses slices is priced separately (`Hardware.collective_s`).
    """
    used = [d for d, _ in axis_spans(slice_, axis_sizes).get(axis, []) if d >= 0]
    if not used:
        # within one chip (v7x's two cores) or a size-1 axis: treat as one fast link
        return 2 * slice_.chip.ici_bw_per_link, 0
    bw = sum(slice_.chip.ici_bw_per_link * (2 if slice_.wraparound(d) else 1) for d in used)
    return bw, len(used)


def dcn_part(slice_: Slice, axis_sizes: dict[str, int], axis: str) -> int:
    """How many slices mesh `axis` spans over the data-center network (1: it stays inside a slice)."""
    return math.prod(n for d, n in axis_spans(slice_, axis_sizes).get(axis, []) if d == -2)
