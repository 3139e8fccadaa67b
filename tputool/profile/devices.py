"""Ask for N simulated CPU devices before JAX starts (XLA_FLAGS), or check that JAX already has them."""

from __future__ import annotations

import os
import sys

from tputool.errors import UserError

FLAG = "--xla_force_host_platform_device_count"


def use_cpu_devices(n: int | None) -> None:
    """Make JAX start with `n` CPU devices; a JAX already started with another count is a UserError."""
    if not n:
        return
    if n < 1:
        raise UserError(f"--cpu-devices must be >= 1, got {n}")
    if "jax" in sys.modules:
        import jax

        if jax.device_count() != n or jax.devices()[0].platform != "cpu":
            raise UserError(f"JAX already started with {jax.device_count()} {jax.devices()[0].platform} device(s); "
                            f"--cpu-devices {n} needs a fresh process")
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(FLAG)]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{FLAG}={n}"])
    os.environ["JAX_PLATFORMS"] = "cpu"


def host_only_jax() -> None:
    """Keep JAX on the host CPU (compile-only TPU devices need no TPU runtime; initialising one would hang)."""
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
