"""Hook graph mode into torch: the Dynamo backend "tpu", the default backend for tpu inputs, compile events.

Default backend: `torch.compile(model)` picks Inductor, which PyTorch 2.13 would send to its Pallas code
generator for `tpu` tensors (and fail). The one entry every default compile passes through is
`torch._TorchCompileInductorWrapper.__call__` (Dynamo calls it with the captured graph and example
inputs), so that is wrapped: graphs with tpu inputs go to backend "tpu"; graphs on other devices reach
Inductor unchanged. Asking Inductor for tpu explicitly (a `mode` or `options`) is refused with an
explanatory error, as TorchTPU does, unless TPUTOOL_FORCE_INDUCTOR=1.

Compiled optimizers: Dynamo makes an optimizer "capturable" (its `step` counters on the parameters' device)
only for CUDA/XPU parameters. On tpu the counters would otherwise stay CPU scalars, and every compiled step
would copy each one to the device and wait for its new value to copy it back (on the tiny Llama that was a
third of the step), so uninitialized optimizers whose parameters are all on tpu are made capturable too.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputool.backend import events

FORCE_INDUCTOR_ENV = "TPUTOOL_FORCE_INDUCTOR"
_installed = False


class InductorOnTpuError(RuntimeError):
    """Inductor was asked explicitly to compile a graph on tpu tensors."""


def _graph_on_tpu(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> bool:
    from tputool.backend.graph.boundary import device_type_of

    if device_type_of(inputs) == "tpu":
        return True
    vals = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes]
    return device_type_of([v for v in vals if isinstance(v, torch.Tensor)]) == "tpu"


def _route_inductor(original: Callable) -> Callable:
    @functools.wraps(original)
    def call(self: Any, model_: torch.fx.GraphModule, inputs_: Sequence[Any], **kwargs: Any) -> Callable:
        if not _graph_on_tpu(model_, inputs_) or os.environ.get(FORCE_INDUCTOR_ENV) == "1":
            return original(self, model_, inputs_, **kwargs)
        if self.config:
            raise InductorOnTpuError(
                "Inductor does not generate code for the tpu device; use torch.compile(model, backend='tpu') "
                f"(or the default backend without mode/options). Set {FORCE_INDUCTOR_ENV}=1 to force Inductor."
            )
        from tputool.backend.graph.dynamo_backend import tpu_backend

        return tpu_backend(model_, inputs_)

    call._tputool_routed = True  # type: ignore[attr-defined]
    return call


def _capturable_on_tpu(original: Callable) -> Callable:
    @functools.wraps(original)
    def set_capturable(self: Any, tx: Any) -> Any:
        state = self.value.state
        for group in self.value.param_groups:
            params = group.get("params", [])
            if ("capturable" in group and params and all(p.device.type == "tpu" for p in params)
                    and not any(p in state for p in params)):
                group["capturable"] = True
        return original(self, tx)

    set_capturable._tputool_tpu = True  # type: ignore[attr-defined]
    return set_capturable


def _patch_optimizer_capture() -> None:
    """Let Dynamo keep a compiled optimizer's step counters on tpu (see the module docstring)."""
    try:
        from torch._dynamo.variables.optimizer import OptimizerVariable
    except ImportError:  # another torch layout: counters stay on the CPU, which is slower but correct
        return
    original = getattr(OptimizerVariable, "_set_capturable", None)
    if original is not None and not getattr(original, "_tputool_tpu", False):
        OptimizerVariable._set_capturable = _capturable_on_tpu(original)


_seen_breaks: dict[str, int] = {}
_seen_failures: dict[Any, tuple[list, int]] = {}


def sync_dynamo_events(*_: Any) -> None:
    """Record Dynamo's new graph breaks and guard failures (recompiles) as backend events."""
    from torch._dynamo import utils
    from torch._dynamo.guards import guard_failures

    for reason, n in utils.counters.get("graph_break", {}).items():
        seen = _seen_breaks.get(reason, 0)
        new = n - seen if n >= seen else n  # fewer than seen: torch._dynamo.reset() cleared the counters
        if new > 0:
            events.record("graph_break", str(reason).strip().splitlines()[0] if str(reason).strip() else "unknown",
                          amount=new)
            _seen_breaks[reason] = n
    for code, reasons in list(guard_failures.items()):
        seen_list, start = _seen_failures.get(code, (None, 0))
        if seen_list is not reasons:  # a new list: torch._dynamo.reset() cleared the old one
            start = 0
        for reason in reasons[start:]:
            events.record("recompile", str(reason).splitlines()[0], function=getattr(code, "co_name", "?"))
        _seen_failures[code] = (reasons, len(reasons))


def watch_dynamo_events() -> None:
    """Run `sync_dynamo_events` at the end of every Dynamo compile (again after `torch._dynamo.reset()`)."""
    from torch._dynamo.callback import callback_handler, on_compile_end

    sync_dynamo_events()
    if sync_dynamo_events not in callback_handler.end_callbacks:
        on_compile_end(sync_dynamo_events)


def install() -> None:
    """Register everything graph mode adds to torch (idempotent)."""
    global _installed
    if _installed:
        return
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    from tputool.backend import distributed
    from tputool.backend.graph import persistent_cache
    from tputool.backend.graph.dynamo_backend import tpu_backend

    if "tpu" not in _BACKENDS:
        register_backend(compiler_fn=tpu_backend, name="tpu")
    wrapper = torch._TorchCompileInductorWrapper
    if not getattr(wrapper.__call__, "_tputool_routed", False):
        wrapper.__call__ = _route_inductor(wrapper.__call__)
    watch_dynamo_events()
    _skip_runtime_modules()
    _patch_optimizer_capture()
    persistent_cache.enable()
    distributed.register()
    _installed = True


RUNTIME_MODULES = (
    "tputool.backend.dispatch", "tputool.backend.storage_kernels", "tputool.backend.tensor",
    "tputool.backend.fallback", "tputool.backend.views", "tputool.backend.view_geometry", "tputool.backend.cache",
    "tputool.backend.events", "tputool.backend.rng", "tputool.backend.runtime", "tputool.backend.op_plan",
    "tputool.backend.fused", "tputool.backend.dtypes", "tputool.backend.lowerings", "jax", "jaxlib",
)
"""The device's own kernels and their helpers, and JAX under them: they run below the dispatcher, never as user
code. Dynamo skips their frames as it skips numpy's: a compiled function that falls back to eager (e.g. at
`.item()`, or a whole frame skipped for a graph break in a loop, as FSDP2's hooks make one) runs them as plain
Python instead of trying to trace them (which failed on the first numpy call, or inside JAX's pytrees)."""


def _skip_runtime_modules() -> None:
    from torch._dynamo import trace_rules

    add = getattr(trace_rules, "add", None)  # (torch's own hook for skipping a library's files)
    for name in RUNTIME_MODULES if add is not None else ():
        add(name)
