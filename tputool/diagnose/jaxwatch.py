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
        """Totals for the whole run and for its second half (steps // 2 onwards) when two or more steps ran."""
        late_from = steps // 2 if steps >= 2 else None
        out = {"compiles": 0, "late_compiles": 0, "first_step_compiles": 0, **{n: 0.0 for n in EVENTS.values()},
               "late_compile_s": 0.0}
        for step, name, secs in self.spans:
            out[name] += secs
            if name == "compile_s":
                out["compiles"] += 1
                out["first_step_compiles"] += step == 0  # (before the first step, or the first call, ended)
            if late_from is not None and step >= late_from and name == "compile_s":
                out["late_compile_s"] += secs
                out["late_compiles"] += 1
        return out
