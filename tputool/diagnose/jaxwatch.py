"""XLA compile time, from JAX's monitoring events (jax.monitoring), split into warm-up and steady state."""

from __future__ import annotations

import sys
from collections.abc import Callable

# JAX's duration events (jax/_src/dispatch.py) -> our name for them.
EVENTS = {
    "/jax/core/compile/backend_compile_duration": "compile_s",
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
}


WARMUP_STEPS = 2
"""Iterations whose XLA compiles are warm-up however short the run: the first builds the optimizer's state, the
second is the first with it (Fused eager compiles a program for each, as torch.compile often recompiles once)."""


def late_compile_steps(steps: int) -> range:
    """The iterations (0-based) of a run of `steps` whose XLA compiles count as late, i.e. recompiles in steady state:
    the second half, none of the first WARMUP_STEPS, and none after the last iteration ended (a final evaluation's
    programs compile once, in no step)."""
    return range(max(steps // 2, WARMUP_STEPS), steps)


class JaxWatch:
    """Sums JAX trace/lower/compile seconds, each tagged with the optimizer step it happened in."""

    def __init__(self, current_step: Callable[[], int]) -> None:
        self.current_step = current_step
        self.spans: list[tuple[int, str, float]] = []  # (step index, our name, seconds)
        self._installed = False

    def install(self) -> bool:
        """Listen to JAX's duration events; False (and nothing done) when the run does not use JAX."""
        if "jax" not in sys.modules:
            return False
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        self._installed = True
        return True

    def remove(self) -> None:
        """Stop listening."""
        if self._installed:
            import jax.monitoring

            jax.monitoring.unregister_event_duration_listener(self._on_duration)
            self._installed = False

    def _on_duration(self, event: str, duration: float, **kwargs: object) -> None:
        name = EVENTS.get(event)
        if name is not None:
            self.spans.append((self.current_step(), name, float(duration)))

    def to_record(self, steps: int) -> dict:
        """Totals for the whole run; `late_*`: the compiles of `late_compile_steps(steps)`."""
        late = late_compile_steps(steps)
        out = {"compiles": 0, "late_compiles": 0, "first_step_compiles": 0, **{n: 0.0 for n in EVENTS.values()},
               "late_compile_s": 0.0}
        for step, name, secs in self.spans:
            out[name] += secs
            if name == "compile_s":
                out["compiles"] += 1
                out["first_step_compiles"] += step == 0  # (before the first step, or the first call, ended)
            if step in late and name == "compile_s":
                out["late_compile_s"] += secs
                out["late_compiles"] += 1
        return out
