"""Lower an ATen-level FX graph to one function on JAX arrays, interpreted node by node through LOWERINGS.

The graph is what AOTAutograd, `make_fx` or `torch.export` produce after core-ATen decompositions:
placeholders, `get_attr` constants, `call_function` nodes whose targets are OpOverloads (looked up in
the op plan's traced table, `tputool.backend.op_plan.TRACED`), `operator.getitem` on tuple results, Python arithmetic on
symbolic sizes, and one output. `jaxify` checks every op up front, so a missing lowering is one clear
error naming the op(s) before anything is traced; `JaxGraph` then traces the interpreter once per
input signature with `jax.jit` (non-array inputs, i.e. sizes, are static arguments).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import torch
from torch import fx

from tputool.backend import asserts, events, executables, runtime
from tputool.backend.lowerings import Lowering
from tputool.backend.lowerings.checks import run_checked

SIZE_OPS: dict[Any, Callable] = {
    torch.ops.aten.sym_size.int: lambda x, d: x.shape[d],
    torch.ops.aten.sym_numel.default: lambda x: math.prod(x.shape),
    torch.ops.aten.sym_storage_offset.default: lambda x: 0,
}
"""Ops on sizes that are evaluated on the traced array's static shape rather than lowered."""

PYTHON_FUNCS: frozenset = frozenset({
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod, operator.neg,
    operator.pow, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
    operator.and_, operator.or_, operator.not_, math.ceil, math.floor, math.sqrt,
    torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_float, torch.sym_int, torch.sym_sqrt, torch.sym_ite,
})
"""Plain Python functions that may appear in a graph on sizes and scalars; called as they are."""


class MissingLoweringError(NotImplementedError):
    """The graph uses ops that have no entry in LOWERINGS."""

    def __init__(self, ops: Sequence[str], graph_name: str) -> None:
        self.ops = list(ops)
        super().__init__(
            f"tpu graph '{graph_name}': no JAX lowering for {', '.join(self.ops)}; add one to "
            "tputool.backend.lowerings (or report it) — this graph cannot be compiled for tpu"
        )


def default_table() -> Mapping:
    """The traced executors' lowering table (`tputool.backend.op_plan.TRACED`)."""
    from tputool.backend.op_plan import TRACED

    return TRACED


def missing_lowerings(gm: fx.GraphModule, table: Mapping | None = None, input_mutations: bool = False) -> list[str]:
    """Names of the graph's call_function targets that neither `table` (default: graph table) nor the
    interpreter handle (`input_mutations`: copies into placeholders are handled, see `interpret`)."""
    table = default_table() if table is None else table
    missing = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        t = node.target
        if t is operator.getitem or t in SIZE_OPS or t in PYTHON_FUNCS or (input_mutations and _is_input_copy(node)):
            continue
        if isinstance(t, torch._ops.OpOverload) and t in table:
            continue
        name = str(t) if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", repr(t))
        if name not in missing:
            missing.append(name)
    return missing


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array) or hasattr(x, "aval")


def _constant(value: Any, to_jax: Callable[[torch.Tensor], jax.Array]) -> Any:
    if isinstance(value, torch.Tensor):
        return to_jax(value)
    return value


_INPUT_COPIES = frozenset({"aten::copy_", "fsdp::copy_"})
"""Copies into a graph input that AOTAutograd keeps in the graph: `aten.copy_`, and FSDP2's `fsdp.copy_`."""


def _is_input_copy(node: fx.Node) -> bool:
    t = node.target
    return (node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t._schema.name in _INPUT_COPIES
            and t._overloadname == "default" and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder")


def mutated_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the placeholders that the graph overwrites with `aten.copy_` (kept input mutations)."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    targets = []
    for n in gm.graph.nodes:
        if _is_input_copy(n) and places.index(n.args[0]) not in targets:
            targets.append(places.index(n.args[0]))
    return targets


def check_sites(gm: fx.GraphModule, table: Mapping) -> tuple[tuple[str, str], ...]:
    """(op, user's file:line) of each node whose lowering checks its indices on the device, in graph order."""
    return tuple((str(n.target), _node_site(n)) for n in gm.graph.nodes
                 if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target in table
                 and table[n.target].checked)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _node_site(node: fx.Node) -> str:
    """The user's file:line that made `node` (the innermost frame of its recorded stack trace)."""
    found = _FRAME.findall(node.meta.get("stack_trace") or "")
    return f"{found[-1][0]}:{found[-1][1]}" if found else f"<graph node {node.name}>"


def interpret(gm: fx.GraphModule, table: Mapping, constants: dict[str, Any],
              input_mutations: bool = False, checks: bool = False) -> Callable[..., tuple]:
    """A Python function (rng_key, *inputs) -> tuple of outputs that evaluates `gm` with `table`'s lowerings.

    With `input_mutations`, `aten.copy_` into a placeholder is not an error: the copied values of the
    `mutated_inputs(gm)` placeholders are returned after the graph's outputs, for the caller to write back.
    With `checks`, the check records of the checked nodes (`check_sites`), stacked, come last (when there are any).
    """
    nodes = list(gm.graph.nodes)
    places = [n for n in nodes if n.op == "placeholder"]
    mutated = [places[i] for i in mutated_inputs(gm)] if input_mutations else []

    def run(rng_key: jax.Array | None, *inputs: Any) -> tuple:
        env: dict[fx.Node, Any] = {}
        records: list = []
        it = iter(inputs)
        key = rng_key

        def value(a: Any) -> Any:
            return fx.node.map_arg(a, lambda n: env[n])

        for node in nodes:
            if node.op == "placeholder":
                env[node] = next(it)
            elif node.op == "get_attr":
                env[node] = constants[node.target]
            elif node.op == "call_function":
                args, kwargs = value(node.args), value(node.kwargs)
                t = node.target
                if t is operator.getitem:
                    env[node] = args[0][args[1]]
                elif mutated and _is_input_copy(node):
                    dst, src = args[0], args[1]
                    env[node.args[0]] = env[node] = jax.numpy.broadcast_to(src.astype(dst.dtype), dst.shape)
                elif t in SIZE_OPS:
                    env[node] = SIZE_OPS[t](*args, **kwargs)
                elif t in PYTHON_FUNCS:
                    env[node] = t(*args, **kwargs)
                else:
                    low: Lowering = table[t]
                    if low.needs_rng:
                        key, sub = jax.random.split(key)
                        kwargs = {**kwargs, "rng_key": sub}
                    if checks and low.checked:
                        env[node], record = run_checked(low.fn, *args, **kwargs)
                        records.append(record)
                    else:
                        env[node] = low.fn(*args, **kwargs)
            elif node.op == "output":
                out = value(node.args[0])
                out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
                out = out + tuple(env[p] for p in mutated)
                return out + (jax.numpy.stack(records),) if records else out
            else:
                raise NotImplementedError(f"tpu graph: FX node kind '{node.op}' ({node.target}) is not supported")
        raise ValueError("graph has no output node")

    return run


@dataclass
class JaxGraph:
    """A graph lowered to JAX: call with the graph's inputs (JAX arrays and Python sizes) to get its outputs.

    Compiled once per input signature (shapes, dtypes, static sizes); each new signature records a
    "compile" event and, after the first, a "recompile" event. Outputs that are sizes rather than
    arrays are computed during tracing and returned from a per-signature table.
    """

    name: str
    fn: Callable[..., tuple]
    uses_rng: bool
    static_positions: tuple[int, ...]
    signatures: dict[tuple, tuple] = field(default_factory=dict)
    _jitted: Callable | None = None
    _static_out: dict[tuple, dict[int, Any]] = field(default_factory=dict)
    _has_static_out: bool = False
    key_from: Callable[[Any], jax.Array] | None = None
    """Turns the `rng_key` argument into a `jax.random` key inside the computation (default: it is one)."""
    mutated: tuple[int, ...] = ()
    """Inputs the graph overwrites; their new values follow the outputs (callers write them back)."""
    _donating: Callable | None = None
    check_sites: tuple[tuple[str, str], ...] = ()
    """(op, user's file:line) of each checked node: the function returns their records last; `__call__` hands them
    to `tputool.backend.asserts` (raised at the next sync point) and returns the other outputs."""
    donated_calls: int = 0
    """How many calls reused the mutated inputs' buffers."""
    spmd: Any = None
    """A `graph.collectives.Spmd`: the graph runs over a process group's devices (its collectives lowered over the
    group's mesh axis), local inputs in, local outputs out; None: on this process's devices."""

    def __post_init__(self) -> None:
        shift = 1  # argument 0 of the jitted function is the RNG key
        static = tuple(p + shift for p in self.static_positions)
        opts = dict(runtime.STATE.compiler_options) or None  # (torch.tpu.compiler.custom_compiler_options)
        if self.spmd is not None:  # (each rank's key words are its block of a global input: made a key per rank)
            self.fn = self.spmd.wrap(self.fn, self._key)
        self._jitted = jax.jit(self._traced, static_argnums=static, compiler_options=opts)
        if self.mutated and self.spmd is None:
            self._donating = jax.jit(self._traced, static_argnums=static, compiler_options=opts,
                                     donate_argnums=tuple(p + shift for p in self.mutated))

    def _key(self, rng_key: Any) -> Any:
        """The `jax.random` key of the `rng_key` argument (see `key_from`), inside the computation."""
        return rng_key if rng_key is None or self.key_from is None else self.key_from(rng_key)

    def _traced(self, rng_key: jax.Array | None, *inputs: Any) -> tuple:
        outs = self.fn(rng_key if self.spmd is not None else self._key(rng_key), *inputs)
        static = {i: o for i, o in enumerate(outs) if o is not None and not _is_array(o)}
        if static:
            self._has_static_out = True
            self._static_out[self._signature(inputs)] = static
            return tuple(None if i in static else o for i, o in enumerate(outs))
        return outs

    def _signature(self, inputs: Sequence[Any]) -> tuple:
        return tuple((tuple(a.shape), str(a.dtype)) if _is_array(a) else ("static", a) for a in inputs)

    def __call__(self, *inputs: Any, rng_key: jax.Array | None = None, donate: bool = False) -> tuple:
        """Run the compiled graph on `inputs` (and a `jax.random` key when `uses_rng`).

        `donate`: the buffers of the mutated inputs may be reused for the results (the caller guarantees
        nothing else reads them afterwards)."""
        spmd = self.spmd
        if spmd is not None:
            rng_key, inputs = spmd.to_global(rng_key, inputs)
        sig = self._signature(inputs) if (self.static_positions or not self.signatures or self._has_static_out) else None
        if sig is not None and sig not in self.signatures:
            if self.signatures:
                events.record("recompile", f"{self.name}: new input signature")
            events.record("compile", self.name)
            executables.settle()  # (a safe point: not inside a trace)
            self.signatures[sig] = sig
        if donate and self._donating is not None:
            self.donated_calls += 1
            fn = self._donating
        else:
            fn = self._jitted
        if spmd is None:
            outs = fn(rng_key, *inputs)
        else:
            outs = spmd.to_local(spmd.run(fn, rng_key, inputs))
        events.launches += 1
        if self._has_static_out:
            for i, v in self._static_out[sig].items():
                outs = outs[:i] + (v,) + outs[i + 1 :]
        if self.check_sites:
            asserts.note(outs[-1], self.check_sites)
            outs = outs[:-1]
        return outs


def jaxify(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    *,
    name: str = "graph",
    table: Mapping | None = None,
    to_jax: Callable[[torch.Tensor], jax.Array] | None = None,
    device_checks: bool = False,
    spmd: Any = None,
) -> JaxGraph:
    """Lower ATen graph `gm` to a `JaxGraph`; raises MissingLoweringError naming every op without a lowering.

    `example_inputs` (real, fake or symbolic) mark which placeholders are sizes (static arguments);
    without them, placeholders whose FX meta value is not a tensor are taken as sizes. `to_jax` converts
    tensor constants (get_attr); by default CPU tensors go through numpy and `tpu` tensors through the backend.
    `device_checks`: checked ops' index checks run on the device and fail at the next sync point
    (`tputool.backend.asserts`), as CUDA's device-side asserts do.
    `spmd`: a `graph.collectives.Spmd` to run the graph with over a process group (`JaxGraph.spmd`).
    """
    table = default_table() if table is None else table
    missing = missing_lowerings(gm, table, input_mutations=True)
    if missing:
        raise MissingLoweringError(missing, name)
    conv = to_jax or default_to_jax
    constants = {
        n.target: _constant(_fetch_attr(gm, n.target), conv) for n in gm.graph.nodes if n.op == "get_attr"
    }
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if example_inputs is not None:
        static = tuple(i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor))
    else:
        static = tuple(
            i for i, n in enumerate(placeholders) if not isinstance(n.meta.get("val", n.meta.get("example_value")),
                                                                    torch.Tensor)
            and ("val" in n.meta or "example_value" in n.meta)
        )
    uses_rng = draws_random(gm, table)
    sites = check_sites(gm, table) if device_checks else ()
    return JaxGraph(name=name, fn=interpret(gm, table, constants, input_mutations=True, checks=bool(sites)),
                    uses_rng=uses_rng, static_positions=static, mutated=tuple(mutated_inputs(gm)), check_sites=sites,
                    spmd=spmd)


def draws_random(gm: fx.GraphModule, table: Mapping | None = None) -> bool:
    """True when a node of `gm` has a lowering that draws random numbers (takes an `rng_key`)."""
    table = default_table() if table is None else table
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target in table and table[n.target].needs_rng
               for n in gm.graph.nodes if n.op == "call_function")


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def default_to_jax(t: torch.Tensor) -> jax.Array:
    """A JAX array for tensor `t`: the backend's own array for `tpu` tensors, a host copy for CPU ones."""
    if t.device.type == "cpu":
        from tputool.backend.tensor import cpu_to_jax

        return cpu_to_jax(t, count=False)
    from tputool.backend.tensor import to_jax

    return to_jax(t)
