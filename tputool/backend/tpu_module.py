"""`torch.tpu`: the device module of the bundled backend, with torch_tpu's public names.

Where a name of the real package has a meaning here it works (devices, RNG, events, streams, eager modes,
precision, autocast dtypes); the rest raise NotImplementedError saying so. Extra beyond the list: CUDA's
memory statistics (`memory_allocated` & co., so ported memory logging keeps working) and `_is_in_bad_fork`
(PyTorch's seeding protocol needs it).
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from dataclasses import dataclass

import jax
import torch

from tputool.backend import memory, rng, runtime
from tputool.backend.tensor import synchronize as _wait_all

_tputool = True  # marks this module as the bundled backend's

EagerMode = runtime.EagerMode


# ---- devices ---------------------------------------------------------------------------------------

def is_available() -> bool:
    """True: the bundled backend runs wherever JAX does."""
    return True


def is_initialized() -> bool:
    """True once the backend is registered (it is, if this module is torch.tpu)."""
    return True


def _is_in_bad_fork() -> bool:
    """True in a process forked after JAX started (a DataLoader worker), where the tpu device refuses to run."""
    return runtime.STATE.bad_fork


def device_count() -> int:
    """Number of JAX devices on JAX's default platform."""
    import jax

    return jax.device_count()


_current = 0


def current_device() -> int:
    """Index of the current tpu device."""
    return _current


def _index(device) -> int:
    if device is None:
        return _current
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"expected a tpu device, got {d}")
    return d.index if d.index is not None else _current


_selected: int | None = None
"""In a multi-process run: the index this process chose with set_device (its one device; tensors report tpu:0)."""


def _local_processes() -> int:
    """Processes on this host in a multi-process run (torchrun's LOCAL_WORLD_SIZE / WORLD_SIZE), else 1."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)


def set_device(device) -> None:
    """Make `device` current. Eager tensors live on tpu:0 (see docs); other indices exist for meshes.

    In a multi-process run (torchrun: WORLD_SIZE > 1) each process has one device, where its eager tensors live:
    `set_device(local_rank)` selects it (it does not start JAX, so it may come before init_process_group), and
    tpu:<local_rank> then names it; the current device stays 0, the index its tensors report (as FSDP2 and
    DeviceMesh expect of the current device)."""
    global _current, _selected
    i = _index(device)
    if int(os.environ.get("WORLD_SIZE") or 1) > 1:
        if not 0 <= i < _local_processes():
            raise RuntimeError(f"invalid tpu device index {i}: {_local_processes()} process(es) on this host")
        _selected = i
        return
    if not 0 <= i < device_count():
        raise RuntimeError(f"invalid tpu device index {i}: {device_count()} device(s)")
    _current = i


def is_own_device(index: int) -> bool:
    """True when tpu:`index` is where this process's eager tensors live: index 0, or, in a multi-process run, the
    device chosen with set_device (a script run by torchrun calls `torch.tpu.set_device(local_rank)` and
    `DDP(device_ids=[local_rank])`)."""
    return index == 0 or index == _selected


class device:  # noqa: N801 - torch.cuda.device's name
    """Context manager that changes the current tpu device."""

    def __init__(self, device) -> None:
        self.idx = _index(device)
        self.prev = None

    def __enter__(self):
        self.prev = _current
        set_device(self.idx)
        return self

    def __exit__(self, *exc) -> None:
        set_device(self.prev)


class device_of(device):  # noqa: N801
    """Context manager: make the device of tensor `obj` current (no-op for non-tpu tensors)."""

    def __init__(self, obj) -> None:
        super().__init__(obj.get_device() if obj.device.type == "tpu" else _current)


def _jax_device(i: int | None = None):
    import jax

    return jax.devices()[_index(i)]


def get_device_name(device=None) -> str:
    """The JAX device kind of the tpu device (e.g. 'cpu' here, 'TPU v5 lite' on a TPU VM)."""
    return _jax_device(device).device_kind


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    platform: str
    id: int
    process_index: int
    total_memory: int

    def __repr__(self) -> str:
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', id={self.id}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB)")


def get_device_properties(device=None) -> _DeviceProperties:
    """Name, platform, id and memory (0 if JAX does not report it) of the tpu device."""
    d = _jax_device(device)
    try:
        stats = d.memory_stats() or {}
    except Exception:  # noqa: BLE001 - some platforms do not implement memory stats
        stats = {}
    return _DeviceProperties(d.device_kind, d.platform, d.id, d.process_index, int(stats.get("bytes_limit", 0)))


_FUSED = runtime.EagerMode.DEFER_AND_FUSE


def synchronize(device=None) -> None:
    """Wait until every tpu computation dispatched so far (whose result is still alive) has finished.

    In the Fused eager mode, the deferred ops are flushed first (reason "synchronize").
    """
    try:
        if runtime.STATE.mode is _FUSED:
            from tputool.backend import fused

            fused.flush("synchronize")
        _wait_all()
    except jax.errors.JaxRuntimeError as e:
        raise memory.translate(e)  # noqa: B904 - an out-of-memory that surfaced late: torch.OutOfMemoryError


# ---- memory ------------------------------------------------------------------------------------------
# Beyond the real package's list (its torch.tpu has no memory statistics): CUDA's names, so the memory logging
# of ported code keeps working. Figures come from JAX (`tputool.backend.memory`); `device` is accepted and
# means tpu:0, where eager tensors live.

def memory_allocated(device=None) -> int:
    """Bytes held by tpu tensors now."""
    return memory.allocated()


def max_memory_allocated(device=None) -> int:
    """The most bytes held by tpu tensors at once since start or reset_peak_memory_stats()."""
    return memory.max_allocated()


def memory_reserved(device=None) -> int:
    """Bytes held by the device allocator (what is allocated, where the platform reports no pool)."""
    return memory.reserved()


def max_memory_reserved(device=None) -> int:
    """The most bytes the device allocator held at once."""
    return memory.max_reserved()


def reset_peak_memory_stats(device=None) -> None:
    """Start max_memory_allocated() over from the bytes held now."""
    memory.reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    """Same as reset_peak_memory_stats()."""
    memory.reset_peak()


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats()'s main keys (allocated/reserved/active bytes, num_ooms) plus JAX's own."""
    return memory.stats()


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    return memory.mem_get_info()


def empty_cache() -> None:
    """Release what the backend holds beyond live tensors: runs the pending Fused trace (whose deferred values
    keep their inputs alive) and waits for work in flight. JAX frees a buffer when its last tensor goes, so
    there is no cached pool to return, unlike CUDA's caching allocator."""
    synchronize()


# ---- RNG ---------------------------------------------------------------------------------------------

_eager_only = torch.compiler.disable
"""For the RNG state functions: a compiled function calling them runs them eagerly (a graph break), as
Dynamo does for CUDA's; tracing them would reach numpy's uint64 packing, which Dynamo cannot trace."""


def manual_seed(seed: int) -> None:
    """Seed the tpu default random stream (one stream serves every device)."""
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Same as manual_seed: the backend has one default random stream."""
    manual_seed(seed)


def seed() -> None:
    """Seed the tpu default stream with a non-deterministic number."""
    manual_seed(int.from_bytes(os.urandom(8), "little"))


def seed_all() -> None:
    """Same as seed()."""
    seed()


def initial_seed() -> int:
    """The seed the default stream started from (the last manual_seed, or the state set last)."""
    return runtime.STATE.rng_seed


@_eager_only
def get_rng_state(device="tpu") -> torch.Tensor:
    """The tpu default random stream's state (a CPU uint8 tensor)."""
    return rng.get_state()


@_eager_only
def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    """Restore a state from get_rng_state."""
    rng.set_state(new_state)


@_eager_only
def get_rng_state_all() -> list[torch.Tensor]:
    return [rng.get_state()]


@_eager_only
def set_rng_state_all(states) -> None:
    rng.set_state(states[0])


_default_generators: tuple = ()


def __getattr__(name: str):
    if name == "default_generators":  # (made on first use: the device count starts JAX)
        global _default_generators
        if not _default_generators:
            _default_generators = tuple(rng.TpuGenerator(i, runtime.STATE) for i in range(device_count()))
        return _default_generators
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- events and streams ------------------------------------------------------------------------------

class Event:
    """A point in the (single, in-order) tpu stream; with enable_timing, records host time after the sync."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream=None) -> None:
        synchronize()
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        synchronize()

    def wait(self, stream=None) -> None:
        """Ops run in order on the one stream: nothing to wait for."""

    def query(self) -> bool:
        return self._time is not None

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event and `end_event` (both recorded, with enable_timing)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calling elapsed_time")
        return (end_event._time - self._time) * 1000.0


class Stream:
    """The tpu stream. There is one: ops run in order, so waits are no-ops and sync waits for all work."""

    def __init__(self, device=None, priority: int = 0) -> None:
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize()

    def wait_event(self, event: Event) -> None:
        pass

    def wait_stream(self, stream: Stream) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)


_streams: list[Stream] = []


def current_stream(device=None) -> Stream:
    """The one tpu stream."""
    if not _streams:
        _streams.append(Stream(0))
    return _streams[0]


def default_stream(device=None) -> Stream:
    """The one tpu stream."""
    return current_stream(device)


def set_stream(stream: Stream) -> None:
    """Accepted for compatibility; every stream is the one in-order stream."""


@contextlib.contextmanager
def stream(stream: Stream | None):
    """Context manager selecting a stream (the one in-order stream, so ops are unaffected)."""
    yield stream


# ---- modes, precision, autocast -------------------------------------------------------------------

def set_eager_mode(mode: EagerMode) -> None:
    """Select Debug (DEFER_NEVER_AND_LAUNCH_BLOCKING), Strict (DEFER_NEVER) or Fused (DEFER_AND_FUSE)."""
    runtime.set_mode(mode)


def eager_mode(mode: EagerMode | None = None):
    """Without an argument: the current EagerMode. With one: a context manager running under it."""
    if mode is None:
        return runtime.STATE.mode

    @contextlib.contextmanager
    def _ctx():
        old = runtime.STATE.mode
        runtime.set_mode(mode)
        try:
            yield
        finally:
            runtime.set_mode(old)

    return _ctx()


class Precision(enum.Enum):
    """Matmul/conv precision, mapped to JAX's default_matmul_precision."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"


def _set_precision(p: Precision) -> None:
    import jax

    jax.config.update("jax_default_matmul_precision", None if p is Precision.DEFAULT else p.value)


_precision = Precision.DEFAULT


@contextlib.contextmanager
def precision(p: Precision | str):
    """Context manager running matmuls/convs at precision `p` (Precision or 'default'/'high'/'highest')."""
    global _precision
    p = Precision(p) if isinstance(p, str) else p
    old = _precision
    _precision = p
    _set_precision(p)
    try:
        yield
    finally:
        _precision = old
        _set_precision(old)


def allow_excess_precision(allow: bool = True) -> None:
    """Allow (True: JAX's default, faster bf16 passes) or forbid (False: 'highest') excess matmul precision."""
    global _precision
    _precision = Precision.DEFAULT if allow else Precision.HIGHEST
    _set_precision(_precision)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast('tpu') accepts."""
    return [torch.bfloat16, torch.float32]


def _is_autocast_available() -> bool:
    return True


# ---- meshes -------------------------------------------------------------------------------------------

def topology_aware_mesh(mesh_shape=None, axis_names=None):
    """A jax.sharding.Mesh over all devices, laid out by JAX's topology-aware device order.

    `mesh_shape` defaults to (device_count(),); `axis_names` to ('data',) or ('axis0', ...). The
    SPMD/graph layer (tputool.backend.graph) consumes it. Built by `tputool.mesh.build_mesh`.
    """
    from tputool.mesh import build_mesh

    shape = tuple(mesh_shape) if mesh_shape is not None else (device_count(),)
    names = tuple(axis_names) if axis_names is not None else (
        ("data",) if len(shape) == 1 else tuple(f"axis{i}" for i in range(len(shape))))
    if len(names) != len(shape):
        raise ValueError(f"mesh_shape {shape} and axis_names {names} differ in length")
    return build_mesh(shape, names, fallback=False)
