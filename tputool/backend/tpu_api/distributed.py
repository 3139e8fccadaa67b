"""`torch.tpu.distributed`: meshes and launch settings.

`topology_aware_mesh` is torch.tpu.topology_aware_mesh (built by tputool.mesh). `set_tpu_launch_env` writes
the libtpu variables that split a host's chips between processes. The rest tune or guard TorchTPU's own
multi-process collective runtime; the bundled backend's process group runs its collectives on JAX's runtime
(`tputool.backend.distributed`), where XLA chooses how: they raise NotImplementedError saying so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh", "window_num_stripes",
           "window_stripe_chunk_mb"]


def topology_aware_mesh(mesh_shape: Sequence[int] | None = None, axis_names: Sequence[str] | None = None):
    """A jax.sharding.Mesh over all devices in topology order (torch.tpu.topology_aware_mesh)."""
    from tputool.backend import tpu_module

    return tpu_module.topology_aware_mesh(mesh_shape, axis_names)


def _ints(v: Sequence[int] | str, name: str, n: int | None = None) -> str:
    parts = [p.strip() for p in v.split(",")] if isinstance(v, str) else [str(x) for x in v]
    if not parts or not all(p.isdigit() for p in parts) or (n is not None and len(parts) != n):
        want = f"{n} " if n else ""
        raise ValueError(f"set_tpu_launch_env: {name} must be {want}non-negative integers, got {v!r}")
    return ",".join(parts)


def set_tpu_launch_env(visible_chips: Sequence[int] | str, process_bounds: Sequence[int] | str | None = None,
                       chips_per_process_bounds: Sequence[int] | str | None = None, *,
                       process_port: int | None = None, process_addresses: Sequence[str] | None = None,
                       environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set libtpu's launch variables (what CUDA_VISIBLE_DEVICES did): TPU_VISIBLE_CHIPS, and for several
    processes on a host TPU_PROCESS_BOUNDS / TPU_CHIPS_PER_PROCESS_BOUNDS (x,y,z), TPU_PROCESS_PORT,
    TPU_PROCESS_ADDRESSES. libtpu reads them when it starts, so set them before the first TPU use (or for the
    processes you launch). Returns the variables set; `environ` defaults to os.environ."""
    env = os.environ if environ is None else environ
    out = {"TPU_VISIBLE_CHIPS": _ints(visible_chips, "visible_chips")}
    if process_bounds is not None:
        out["TPU_PROCESS_BOUNDS"] = _ints(process_bounds, "process_bounds", 3)
    if chips_per_process_bounds is not None:
        out["TPU_CHIPS_PER_PROCESS_BOUNDS"] = _ints(chips_per_process_bounds, "chips_per_process_bounds", 3)
    if process_port is not None:
        out["TPU_PROCESS_PORT"] = str(int(process_port))
    if process_addresses is not None:
        out["TPU_PROCESS_ADDRESSES"] = ",".join(process_addresses)
    env.update(out)
    return out


def _multi_process_only(name: str) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"torch.tpu.distributed.{name} is not available in tputool's bundled backend: it configures "
            "TorchTPU's own multi-process collective runtime; the bundled backend's collectives run on JAX's "
            "distributed runtime, where XLA chooses how they are striped")

    fn.__name__ = name
    fn.__doc__ = "Not available here: TorchTPU's multi-process runtime setting."
    return fn


spmd_safe = _multi_process_only("spmd_safe")
window_num_stripes = _multi_process_only("window_num_stripes")
window_stripe_chunk_mb = _multi_process_only("window_stripe_chunk_mb")
