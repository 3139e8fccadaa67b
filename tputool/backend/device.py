"""Registration of the bundled `tpu` device: PrivateUse1 renamed `tpu`, its kernels, torch.tpu, autocast.

`torch.tpu`'s submodules come from `tpu_api/`. `register()` is idempotent and is called by the torch.backends entry point (`_loader.load`) and by
`import tputool.backend`. Where Google's torch_tpu is installed it owns the device and this steps aside.
"""

from __future__ import annotations

import gc
import logging
import os
import warnings

import torch

log = logging.getLogger("tputool.backend")

_registered = False
_libs: list = []

GC_FREEZE_ENV = "TPUTOOL_GC_FREEZE"
"""`0` keeps the objects alive at registration in the garbage collector's generations (see `_freeze_startup`)."""


TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
"""Device files a TPU VM exposes (accel: v2-v6e; vfio: v5p, v6e and later)."""


def tpu_attached() -> bool:
    """True when this machine has a TPU attached (one of TPU_DEVICE_GLOBS exists)."""
    import glob

    return any(glob.glob(pattern) for pattern in TPU_DEVICE_GLOBS)


def keep_jax_on_cpu_without_tpu() -> None:
    """Before JAX starts: on a machine with no TPU and no JAX_PLATFORMS set, set JAX_PLATFORMS=cpu.

    With the libtpu wheel installed (extra `tpu-compile`), JAX would otherwise initialise libtpu at start-up
    and print its errors (`TPU_WORKER_HOSTNAMES`); compile-only topologies
    (`jax.experimental.topologies.get_topology_desc`) work with the CPU platform."""
    import sys

    if "jax" in sys.modules or os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME"):
        return
    if not tpu_attached():
        os.environ["JAX_PLATFORMS"] = "cpu"


def device_count() -> int:
    """Number of tpu devices: the number of JAX devices on JAX's default platform."""
    import jax

    return jax.device_count()


def register(freeze_gc: bool = False) -> bool:
    """Register the bundled tpu device (once). False when torch_tpu or another backend owns PrivateUse1.

    `freeze_gc`: afterwards move the objects alive to the collector's permanent generation (`_freeze_startup`);
    the loader asks for it inside `import torch`, when those objects are only what the imports made."""
    global _registered
    if _registered:
        return True
    from tputool.backend._loader import real_torch_tpu_installed

    if real_torch_tpu_installed():
        log.info("tputool: using the real torch_tpu; the bundled tpu backend stays off")
        return False
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "tpu"):
        log.warning("tputool: PrivateUse1 is already registered as %r; the bundled tpu backend stays off", name)
        return False
    if name == "tpu" and hasattr(torch, "tpu") and not getattr(torch.tpu, "_tputool", False):
        log.info("tputool: the tpu device is already registered by another package")
        return False

    keep_jax_on_cpu_without_tpu()
    import jax

    # int64/float64 tensors keep their dtype and values (JAX would narrow them to 32 bits).
    jax.config.update("jax_enable_x64", True)

    # Import everything first, so a failure leaves PrivateUse1 untouched.
    from tputool.backend import autocast, dispatch, op_plan, storage_kernels, tpu_module  # noqa: F401

    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        "tpu", backend_module=tpu_module, hook=_Hooks(), device_guard=_Guard())
    from tputool.backend import tpu_api

    tpu_api.install(tpu_module)  # torch.tpu.pallas, .ops, .optimizers, ... (also as modules torch.tpu.<name>)
    from tputool.backend import rng

    rng.install_generator()  # torch.Generator(device="tpu")
    _register_kernels()
    from tputool.backend import (
        data_parallel,
        hf_accelerate,
        hf_generate,
        module_ties,
        serialization,
        storages,
    )

    module_ties.install()
    data_parallel.install()
    hf_generate.install()
    hf_accelerate.install()
    serialization.install()
    serialization.install_pin_memory()
    storages.install()
    _registered = True
    from tputool.backend import runtime

    if runtime.STATE.mode is not runtime.DEFAULT_MODE:
        runtime.set_mode(runtime.DEFAULT_MODE)
    # Graph mode: the Dynamo backend "tpu" (also the default for tpu inputs), the XLA disk cache and
    # the torch.distributed backends "tpu"/"tpu_dist".
    from tputool.backend import graph

    graph.install()
    if freeze_gc:
        _freeze_startup()
    return True


def _freeze_startup() -> None:
    """Move the objects alive now (torch's, JAX's and tputool's modules: ~370k) to the collector's permanent
    generation. Each tpu op allocates Python objects (tensors; in Fused mode also the pending values of a
    trace), which triggers full collections that would rescan them all: on the small Llama in Fused mode,
    ~60 ms a step. Reference counting still frees them; only a reference cycle among them is never collected,
    which is why only the autoload does it (a late `import tputool.backend` would freeze the user's objects).
    """
    if os.environ.get(GC_FREEZE_ENV, "1") != "0":
        gc.freeze()


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _register_kernels() -> None:
    from tputool.backend import autocast, dispatch, fork, sparse, storage_kernels

    lib = torch.library.Library("_", "IMPL")
    lib.fallback(dispatch.boxed_fallback, dispatch_key="PrivateUse1", with_keyset=True)
    _libs.append(lib)
    aten_lib = torch.library.Library("aten", "IMPL")
    _libs.append(aten_lib)
    for op in hot_ops(storage_kernels.HOT):
        aten_lib.impl(op._schema.name.split("::")[1] + (f".{op._overloadname}" if op._overloadname != "default"
                                                         else ""), dispatch.kernel_for(op), "PrivateUse1")
    with warnings.catch_warnings():  # (these replace PyTorch's fallthrough, which it warns about)
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        for name, kernel in storage_kernels.BIT_KERNELS.items():
            for key in ("Conjugate", "Negative"):
                aten_lib.impl(name, kernel, key)
    sparse.register(aten_lib)
    fork.install([lib, aten_lib, *sparse.libraries()])  # (a child forked after JAX started swaps them for a kernel that refuses)
    autocast.register(_libs)


# Ops that keep PyTorch's own (composite) kernels in eager mode: detach/alias must alias (and FakeTensor
# creation relies on them); empty_like must keep the input's strides and stay unmaterialized.
_KEEP_COMPOSITE = {"aten::detach", "aten::alias", "aten::lift_fresh", "aten::lift", "aten::empty_like"}


def hot_ops(special) -> list:
    """Ops worth a direct PrivateUse1 kernel: `special` kernels, and lowered ops (with their in-place and
    out= variants) that are not CompositeImplicitAutograd (those never reach the device key)."""
    from tputool.backend.op_plan import eager_lowered_ops, eager_lowering, functional_of

    ops = list(special)
    seen = set(ops)
    cands = []
    for op in eager_lowered_ops():
        pkt = op.overloadpacket
        cands.append(op)
        inplace = getattr(torch.ops.aten, pkt.__name__ + "_", None)
        if inplace is not None and hasattr(inplace, op._overloadname):
            cands.append(getattr(inplace, op._overloadname))
    for op in cands:
        if op in seen or op._schema.name in _KEEP_COMPOSITE:
            continue
        name = op.name()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            continue
        f = functional_of(op)
        if f is not None and eager_lowering(f) is None:
            continue
        seen.add(op)
        ops.append(op)
    return ops
