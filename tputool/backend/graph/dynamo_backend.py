"""`torch.compile(model, backend="tpu")`: Dynamo graph -> AOTAutograd -> one `jax.jit` per forward/backward.

AOTAutograd functionalizes the captured graph, applies the op plan's graph decompositions (core ATen's, except
for ops that have their own lowering: `op_plan.graph_decompositions`), splits it into forward and backward,
and hands each to `compile_graph`, which lowers it with `jaxify`. At run time inputs are unwrapped to JAX arrays (parameters stay on the device, no copy),
the one compiled computation runs, and outputs are wrapped back. Input and buffer mutations (BatchNorm
running stats, in-place ops on inputs) come back from the functionalized graph as extra outputs and
AOTAutograd's runtime copies them into the original tensors.

Shapes: Dynamo may pass symbolic sizes after a shape change; they arrive as Python ints at run time and
are static arguments to `jax.jit`, so every concrete shape gets its own static XLA computation.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
from torch import fx

from tputool.backend import memory, op_plan
from tputool.backend.graph import boundary
from tputool.backend.graph.jaxify import JaxGraph, jaxify

_graph_ids = itertools.count()


class CompiledGraph:
    """Callable with AOTAutograd's boxed convention: a list of tensors/sizes in, a list of outputs out."""

    def __init__(self, graph: JaxGraph, device_type: str, out_devices: tuple[str, ...] = ()) -> None:
        self._boxed_call = True  # an instance attribute: wrappers copy __dict__, not class attributes
        self.graph = graph
        self.device_type = device_type
        self.out_devices = out_devices
        """Device type of each output (`boundary.output_devices`); outputs past it get `device_type`."""

    def __call__(self, args: list) -> list:
        """Unwrap `args`, run the JAX computation, write mutated inputs back, wrap the other outputs."""
        to_jax = boundary.to_jax
        ins = [to_jax(a) for a in args]
        mutated = self.graph.mutated
        targets = [args[i] for i in mutated]
        donate = self.device_type == "tpu" and all(boundary.donatable(args[i], ins[i]) for i in mutated)
        args.clear()  # boxed convention: let AOTAutograd free inputs it no longer needs
        key = boundary.next_rng_words() if self.graph.uses_rng else None
        try:
            outs = self.graph(*ins, rng_key=key, donate=bool(mutated) and donate)
        except jax.errors.JaxRuntimeError as e:
            raise memory.translate(e)  # noqa: B904 - out of memory becomes torch.OutOfMemoryError
        del ins
        if mutated:
            n = len(outs) - len(mutated)
            boundary.write_back(targets, outs[n:])
            outs = outs[:n]
        dev, devs = self.device_type, self.out_devices
        from_jax = boundary.from_jax
        if len(devs) == len(outs):
            return [from_jax(o, d) for o, d in zip(outs, devs, strict=True)]
        return [from_jax(o, dev) for o in outs]


def compile_graph(kind: str) -> Callable[[fx.GraphModule, Sequence[Any]], CompiledGraph]:
    """An AOTAutograd compiler for `kind` ("forward", "backward", "inference") that lowers to one jax.jit."""

    def compiler(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[[list], list]:
        from tputool.backend.graph import persistent_cache

        persistent_cache.enable()
        dev = boundary.device_type_of(example_inputs) if example_inputs else _device_of(gm)
        if torch.distributed.is_available():
            from tputool.backend.graph import collectives

            if collectives.needs_split(gm):  # collectives over several ranks: one program over the group's devices
                spmd = collectives.spmd_for(gm)
                if spmd is not None:
                    return _compile(gm, example_inputs, kind, dev, spmd=spmd)
                return collectives.split_compile(gm, lambda piece: _compile(piece, None, kind, dev))
        return _compile(gm, example_inputs, kind, dev)

    return compiler


def _compile(gm: fx.GraphModule, example_inputs: Sequence[Any] | None, kind: str, dev: str,
             spmd: Any = None) -> CompiledGraph:
    """`gm` lowered by jaxify to one computation, as a boxed callable whose outputs live on `dev`'s type
    (`spmd`: see `jaxify`)."""
    graph = jaxify(gm, example_inputs, name=f"graph{next(_graph_ids)}.{kind}", device_checks=True, spmd=spmd)
    graph.key_from = boundary.key_from_words
    return CompiledGraph(graph, dev, boundary.output_devices(gm, dev))


def _device_of(gm: fx.GraphModule) -> str:
    vals = [n.meta.get("val") for n in gm.graph.nodes]
    return boundary.device_type_of([v for v in vals if isinstance(v, torch.Tensor)])


_aot_backend: Callable | None = None
PARTITIONER_ENV = "TPUTOOL_PARTITIONER"
"""How AOTAutograd splits forward and backward: 'min_cut' (default) or 'default'."""


# torch.compile's modes tune Inductor (CUDA graphs, autotuning); the tpu graph is already one XLA program per
# call, so each mode compiles the same program and keeps the program's meaning.
COMPILE_MODES = frozenset({"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"})


def _check_options(options: dict[str, Any]) -> None:
    """Accept torch.compile's `mode` (a performance hint); refuse anything else with the reason."""
    mode = options.pop("mode", None)
    if mode is not None and mode not in COMPILE_MODES:
        raise RuntimeError(f"Unrecognized mode={mode!r}, should be one of: {', '.join(sorted(COMPILE_MODES))}")
    if options:
        raise TypeError(f"backend 'tpu' takes no options, got {sorted(options)} (Inductor's options= do not "
                        "apply to TPU graphs; remove them)")


def tpu_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable:
    """The Dynamo backend "tpu": compile Dynamo's FX graph for the tpu device through AOTAutograd and JAX."""
    global _aot_backend
    from tputool.backend.graph.hooks import watch_dynamo_events

    watch_dynamo_events()
    _check_options(options)
    if _aot_backend is None:
        from functorch.compile import default_partition, min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        choice = os.environ.get(PARTITIONER_ENV, "min_cut")
        partitioners = {"min_cut": min_cut_rematerialization_partition, "default": default_partition}
        if choice not in partitioners:
            raise ValueError(f"{PARTITIONER_ENV}={choice!r}: use 'min_cut' (recompute cheap ops in the backward, "
                             "less memory) or 'default' (save every forward value)")
        partitioner = partitioners[choice]
        _aot_backend = aot_autograd(
            fw_compiler=compile_graph("forward"),
            bw_compiler=compile_graph("backward"),
            inference_compiler=compile_graph("inference"),
            decompositions=op_plan.graph_decompositions(),
            partition_fn=partitioner,
            keep_inference_input_mutations=True,  # copied back by CompiledGraph, not by eager copy_
        )
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tputool.backend.graph.attention import fuse_attention  # here: its custom ops cost ~9 ms to register

    fuse_attention(gm)  # attention stays one op (tputool::sdpa) unless dropout/autocast need PyTorch's math
    with sdpa_kernel(SDPBackend.MATH):  # what is left of attention: matmul+softmax, no device-specific kernels
        return _aot_backend(gm, example_inputs)
