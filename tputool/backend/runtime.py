"""The backend's runtime state, in one object (`STATE`), and its one reset point (`reset`).

What the backend *knows* — the lowering table, op plans, eager handlers, compiled kernels — is derived
once and kept for the process. What it is *doing* is runtime state, all of it reachable from `STATE`:
  mode / blocking     the eager mode (torch.tpu.EagerMode) and whether each op is waited for (Debug mode);
  rng_seed / counter  the random stream (`tputool.backend.rng` draws from it);
  trace               the pending Fused trace, once the fused engine is loaded (`tputool.backend.fused`);
  in_flight           arrays dispatched but not yet waited for (`tputool.backend.tensor`);
  mem_* / num_ooms    the memory peak and out-of-memory count (`tputool.backend.memory`);
  compiler_options    XLA options set by torch.tpu.compiler.custom_compiler_options;
  sdpa_kernel         the attention implementation compiled graphs' SDPA uses (set by a tuned config);
  moe_dispatch        how the built-in MoE layer dispatches tokens to experts (set by a tuned config);
  moe_mesh            the mesh sparse MoE layers run per device of (set by a tuned config's shard_model);
  asserts             device-side index checks waiting for the next sync point (`tputool.backend.asserts`).
The dispatcher reads `STATE.blocking` on every op (one attribute read, as a module global costs).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class EagerMode(enum.Enum):
    """How eager ops run: Debug, Strict or Fused (the default), named as in torch_tpu."""

    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    """Debug: each op is compiled and run at once, and the host waits for it (errors point at the caller)."""
    DEFER_NEVER = "strict"
    """Strict: each op runs as its own cached, compiled kernel, asynchronously."""
    DEFER_AND_FUSE = "fused"
    """Fused: ops are deferred and fused into larger compiled computations (tputool.backend.fused)."""


DEFAULT_MODE = EagerMode.DEFER_AND_FUSE
"""The eager mode of a fresh process (set when the device registers) and of `reset()`."""

DEFAULT_SEED = 67280421310721
"""PyTorch's default seed for device generators."""


@dataclass(slots=True)
class Runtime:
    """Everything the backend is doing now (see the module docstring)."""

    mode: EagerMode = EagerMode.DEFER_NEVER
    """(the state before any mode is set up; the device's registration then sets DEFAULT_MODE)"""
    blocking: bool = False
    rng_seed: int = DEFAULT_SEED
    rng_counter: int = 0
    trace: Any = None
    """The Fused trace (`tputool.backend.fused.TRACE`), set when the fused engine loads."""
    in_flight: list = field(default_factory=list)
    """Weak references to arrays dispatched and not yet waited for (`tputool.backend.tensor.track`)."""
    mem_peak: int = 0
    """Highest allocated bytes seen since the last peak reset (`tputool.backend.memory`)."""
    mem_device_peak_at_reset: int = 0
    """The device's own peak_bytes_in_use when the peak was last reset (0: never)."""
    num_ooms: int = 0
    """Out-of-memory errors raised (memory_stats()['num_ooms'])."""
    asserts: list = field(default_factory=list)
    """(check records, their (op, file:line) sites) of Fused flushes and compiled graphs not yet read."""
    assert_acc: Any = None
    """Strict mode's first failed check since the last sync point, on the device (`tputool.backend.asserts`)."""
    assert_sites: list = field(default_factory=list)
    """(op, file:line) of each Strict-mode checked op since the last sync point (numbered as in assert_acc)."""
    assert_failure: str | None = None
    """A failed check already read back (the pending list overflowed), raised at the next sync point."""
    bad_fork: bool = False
    """True in a child forked after JAX started, where the device refuses to run (`tputool.backend.fork`);
    `reset()` keeps it."""
    compiler_options: dict = field(default_factory=dict)
    """XLA options for computations compiled from now on (`torch.tpu.compiler.custom_compiler_options`)."""
    sdpa_kernel: tuple[str, int, Any] | None = None
    """(implementation, block, mesh or None) of `tputool::sdpa` in graphs compiled from now on
    (`graph/attention_kernels.py`; set by `tputool.tune.apply_config`, the mesh by the config's `shard_model`);
    None: the default blocked XLA attention."""
    moe_dispatch: str | None = None
    """How `tputool.models.moe.MoEFeedForward` layers without their own setting dispatch tokens: "dense", or
    sparse through the grouped matmul "ragged" / "gmm" (`graph/grouped_matmul.py`); set by
    `tputool.tune.apply_config`, read at each forward (so graphs traced afterwards follow it). None: dense."""
    abstract: Any = None
    """Under `tputool diagnose --target` (`tputool.diagnose.target_run`): the abstract run, whose tpu tensors
    hold JAX tracers of one trace (shapes and dtypes, no data); large host->tpu copies become placeholders and
    reads of values to the host call its `read(array, reason)` for a placeholder value. None: a real run."""
    moe_mesh: Any = None
    """The mesh sparse MoE layers traced from now on run per device of (`graph/moe_experts.py`; set by the
    active tuned config's `shard_model`); None: over the whole batch at once."""


STATE = Runtime()
"""The process's runtime state."""

_fuse_hook: Callable[[EagerMode, EagerMode], None] | None = None


def set_fuse_hook(hook: Callable[[EagerMode, EagerMode], None] | None) -> None:
    """Install the fused-mode engine's callback, called as hook(old, new) on every mode change."""
    global _fuse_hook
    _fuse_hook = hook


def set_mode(mode: EagerMode) -> None:
    """Make `mode` current (raises ValueError for a non-EagerMode, RuntimeError if Fused is unavailable)."""
    if not isinstance(mode, EagerMode):
        raise ValueError(f"expected a torch.tpu.EagerMode, got {mode!r}")
    if mode is EagerMode.DEFER_AND_FUSE and _fuse_hook is None:
        try:
            import tputool.backend.fused  # noqa: F401 - installs the hook
        except ImportError:
            pass
        if _fuse_hook is None:
            raise RuntimeError("EagerMode.DEFER_AND_FUSE needs the fused engine (tputool.backend.fused), "
                               "which is not available in this install")
    old, STATE.mode = STATE.mode, mode
    STATE.blocking = mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if _fuse_hook is not None:
        _fuse_hook(old, mode)


def reset() -> None:
    """Return the runtime state to a fresh process's: DEFAULT_MODE (a pending Fused trace is dropped, not run),
    the default random seed, no compiler options, SDPA kernel or MoE dispatch or mesh, no events, nothing in flight (waited for first). Compiled kernels are kept."""
    if STATE.trace is not None:
        STATE.trace.reset()
    set_mode(DEFAULT_MODE)
    STATE.rng_seed, STATE.rng_counter = DEFAULT_SEED, 0
    STATE.mem_peak = STATE.mem_device_peak_at_reset = STATE.num_ooms = 0
    STATE.compiler_options = {}
    STATE.sdpa_kernel = None
    STATE.moe_dispatch = STATE.moe_mesh = None
    from tputool.backend import events

    events.reset()  # (the event record diagnose reads: `tputool.backend.events`)
    for r in list(STATE.in_flight):
        a = r()
        if a is not None:
            a.block_until_ready()
    STATE.in_flight.clear()
    STATE.asserts.clear()
    STATE.assert_sites.clear()
    STATE.assert_acc = STATE.assert_failure = None
