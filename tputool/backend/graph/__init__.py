"""Graph mode of the bundled `tpu` backend: FX->JAX lowering, `torch.compile(backend="tpu")`, the compile cache,
SPMD sharding. (Fused eager mode lives with the other eager code: `tputool.backend.fused`.)

`install()` (called when the device registers) hooks it into torch.
"""

from __future__ import annotations


def install() -> None:
    """Register the Dynamo backend "tpu", route default torch.compile on tpu inputs to it, enable the caches."""
    from tputool.backend.graph.hooks import install as _install

    _install()
