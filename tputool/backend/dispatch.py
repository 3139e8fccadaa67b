"""Eager (Strict/Debug) op dispatch for the tpu device.

Every op reaching the PrivateUse1 key gets one handler, built once per OpOverload from its plan
(`tputool.backend.op_plan`: kernel / lowering / in-place or out= variant / decomposition / CPU fallback)
and kept in `HANDLERS`. Lowered ops run as one cached `jax.jit` kernel per signature (`tputool.backend.cache`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import torch

from tputool.backend import asserts, cache, events, fallback, memory, op_plan, rng
from tputool.backend import tensor as tt
from tputool.backend.lowerings import Lowering, Unsupported
from tputool.backend.lowerings.checks import fold, run_checked
from tputool.backend.op_plan import Route, cast_results, written_tensors
from tputool.backend.runtime import STATE as _state

Handler = Callable[[tuple, dict], object]
HANDLERS: dict[torch._ops.OpOverload, Handler] = {}
"""OpOverload -> its handler, filled on first use (and for hot ops at registration)."""

# Argument kinds.
T, OT, TL, OTL, SC, ST = "T", "OT", "TL", "OTL", "SC", "ST"
_NODEFAULT = object()

_create = torch._C._acc.create_empty_tensor
_track = tt.track
_NP_TO_TORCH = tt.dtypes.NP_TO_TORCH
_Uninit = tt.Uninit
_JaxError = jax.errors.JaxRuntimeError
_translate = memory.translate


def _arg_kind(a: torch._C.Argument) -> str:
    ty = a.type
    if isinstance(ty, torch._C.TensorType):
        return T
    if isinstance(ty, torch._C.OptionalType) and isinstance(ty.getElementType(), torch._C.TensorType):
        return OT
    if isinstance(ty, torch._C.ListType):
        el = ty.getElementType()
        if isinstance(el, torch._C.TensorType):
            return TL
        if isinstance(el, torch._C.OptionalType) and isinstance(el.getElementType(), torch._C.TensorType):
            return OTL
    if isinstance(ty, torch._C.NumberType):
        return SC
    return ST


_NUMBER = (int, float, bool, complex)
_SIMPLE = {int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout}


def _hashable(v):
    if isinstance(v, list | tuple):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, float) and v != v:
        return ("nan",)
    return v


def tensor_value(t: torch.Tensor) -> jax.Array:
    """The JAX value of a tensor argument: a tpu tensor's data, or a copy of a CPU tensor (0-dim scalars)."""
    try:
        base = t.untyped_storage()._tpu
        # The common case inline: a tensor that is its whole storage (what every op returns).
        if type(base) is not _Uninit and t.storage_offset() == 0 and t.shape == base.shape and t.is_contiguous():
            return base
        return tt.to_jax(t)
    except AttributeError:
        if t.device.type == "cpu":
            return tt.host_operand(t)  # (a 0-dim scalar; anything bigger raises, as on CUDA)
        raise RuntimeError(f"tpu backend: got a {t.device} tensor without tpu data ({type(t).__name__})") from None


class Signature:
    """An op's schema, digested once: argument kinds, defaults, which are kwarg-only / written."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        s = op._schema
        self.op = op
        self.name = str(op)
        self.args = list(s.arguments)
        self.names = [a.name for a in self.args]
        self.kinds = [_arg_kind(a) for a in self.args]
        self.kwarg_only = [a.kwarg_only for a in self.args]
        self.defaults = [a.default_value if a.has_default_value() else _NODEFAULT for a in self.args]
        self.written = [i for i, a in enumerate(self.args) if a.alias_info is not None and a.alias_info.is_write]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.returns = [str(r.type) for r in s.returns]

    def normalize(self, args: tuple, kwargs: dict) -> list:
        """All argument values in schema order, defaults filled in."""
        vals = list(args)
        n = len(self.args)
        if len(vals) < n:
            vals.extend(self.defaults[len(vals):])
            for k, v in kwargs.items():
                vals[self.index[k]] = v
        for i, v in enumerate(vals):
            if v is _NODEFAULT:
                raise TypeError(f"{self.name}: missing argument {self.names[i]!r}")
        return vals


class LoweredOp:
    """Runs a functional lowering as a cached jitted kernel; subclasses add in-place and out= writes.

    A call the lowering refuses (`Unsupported`) goes through the CPU fallback.
    """

    def __call__(self, args: tuple, kwargs: dict, moved: bool = False):
        try:
            return self.call(args, kwargs)
        except Unsupported:
            return fallback.run_on_cpu(self.op, args, kwargs)
        except (TypeError, ValueError, IndexError) as e:
            raise self._error(e) from e
        except tt.MixedDevices:
            if not self.host_args or moved:
                raise
            return self(*host_args_to_device(self.sig, self.host_args, args, kwargs), moved=True)

    def _error(self, e: Exception) -> RuntimeError:
        # JAX reports bad shapes/arguments while tracing; PyTorch code expects a RuntimeError (and a
        # TypeError inside `a @ b` would turn into "unsupported operand").
        return RuntimeError(f"{self.name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

    def direct_kernel(self) -> Callable:
        """A Python kernel for torch.library registration: `call`'s fast path inlined for a single-Tensor
        result and a known plan (the hot path of eager dispatch), else the general `__call__`."""
        general, plans, op, name = _guarded(self), self._plans, self.op, self.name
        value, record, track = tensor_value, cache.record_compile, _track
        create, to_torch, ev = _create, _NP_TO_TORCH, events
        if not (self._fast_ok and self.single) or self.host_args or self.checked:
            return _general_kernel(self)

        def kernel(*args, **kwargs):
            if kwargs:
                return general(args, kwargs)
            nargs = len(args)
            # (tuple(map(type, args)) costs 4x more than building the tuple for one or two arguments)
            if nargs == 2:
                plan = plans.get((type(args[0]), type(args[1])))
            elif nargs == 1:
                plan = plans.get((type(args[0]),))
            else:
                plan = plans.get(tuple(map(type, args)))
            if not plan or plan.rng:
                return general(args, kwargs)
            try:
                if plan.spos:
                    fn = plan.fns.get(tuple([args[i] for i in plan.spos]))
                    if fn is None:
                        return general(args, kwargs)
                else:
                    fn = plan.fns[()]
                n = fn._cache_size()
                if not plan.all_tensors:
                    out = fn(*[value(args[i]) if is_t else args[i] for i, is_t in plan.dpos])
                elif nargs == 2:
                    out = fn(value(args[0]), value(args[1]))
                elif nargs == 1:
                    out = fn(value(args[0]))
                else:
                    out = fn(*map(value, args))
                if fn._cache_size() != n:
                    record(name)
                ev.launches += 1
                track(out)
                if _state.blocking:
                    jax.block_until_ready(out)
            except Unsupported:
                return fallback.run_on_cpu(op, args, kwargs)
            except (TypeError, ValueError, IndexError) as e:
                raise self._error(e) from e
            except _JaxError as e:
                raise _translate(e)  # noqa: B904 - out of memory becomes torch.OutOfMemoryError (cause kept)
            av = out.aval  # (a plain attribute; Array.shape/.dtype are properties reading it)
            t = create(av.shape, to_torch[av.dtype])
            t.untyped_storage()._tpu = out
            return t

        return kernel

    def __init__(self, op: torch._ops.OpOverload, low: Lowering, sig_op: torch._ops.OpOverload | None = None):
        self.op = op
        self.sig = Signature(op)
        fsig = Signature(sig_op) if sig_op is not None else self.sig
        self.fsig = fsig
        self.low = low
        self.name = str(op)
        # The functional op's arguments (their positions in self.sig's order), less `generator`: a random op
        # draws its key from the generator's stream (`gen_pos`), which is no argument of the kernel.
        fargs = [j for j, n in enumerate(fsig.names) if n != "generator"]
        self.gen_pos = self.sig.index.get("generator") if low.needs_rng else None
        self.fpos = [self.sig.index[fsig.names[j]] for j in fargs]
        self.fkw = [fsig.kwarg_only[j] for j in fargs]
        self.fnames = [fsig.names[j] for j in fargs]
        self.fkinds = [self.sig.kinds[p] for p in self.fpos]
        if low.dynamic_floats:  # `float` arguments traced like Scalars
            self.fkinds = [SC if isinstance(fsig.args[j].type, torch._C.FloatType) else k
                           for j, k in zip(fargs, self.fkinds, strict=True)]
        self.fdefaults = [fsig.defaults[j] for j in fargs]
        self.single = len(fsig.returns) == 1 and fsig.returns[0] == "Tensor"
        self.dyn_scalars = not low.static_scalars
        self._fns: dict = {}
        # Fast path (plain functional calls, positional arguments only): type(arg) for each argument ->
        # a _Plan, or False where those types need the general path (lists, dynamic Scalar arguments).
        self._plans: dict[tuple, _Plan | bool] = {}
        self._fast_ok = type(self) is LoweredOp and (self.gen_pos is None or self.sig.kwarg_only[self.gen_pos])
        self.host_args = op_plan.plan(op).host_args
        self.checked = low.checked
        """The kernel returns (results, check record): an index check for the next sync point (`asserts`)."""

    def _prepare(self, vals: list) -> tuple[tuple, list]:
        """(cache key, dynamic values) for the functional arguments (the per-call hot loop).

        Key entries: 0 = a dynamic tensor, (2, type) = a dynamic scalar, ("L", mask) = a tensor list
        (mask: which entries are tensors), ("s", value, type) = a static value.
        """
        key = []
        dyn = []
        fk, fd, dyn_sc = self.fkinds, self.fdefaults, self.dyn_scalars
        for j, p in enumerate(self.fpos):
            v = vals[p]
            k = fk[j]
            tv = type(v)
            if k is T or (k is OT and v is not None):
                if tv in _NUMBER:  # a wrapped number: Python scalar where the schema says Tensor
                    dyn.append(v)
                    key.append((2, tv))
                else:
                    dyn.append(tensor_value(v))
                    key.append(0)
            elif (k is TL or k is OTL) and v is not None:
                mask = tuple(x is not None for x in v)
                for x in v:
                    if x is not None:
                        dyn.append(tensor_value(x))
                key.append(("L", mask))
            elif k is SC and dyn_sc and v is not None and tv is not bool and v != fd[j]:
                dyn.append(v)
                key.append((2, tv))
            else:
                key.append(("s", v if tv in _SIMPLE else _hashable(v), tv))
        return tuple(key), dyn

    def _template(self, key: tuple, vals: list) -> list:
        """The kernel's argument template for `key`: 0/2 dynamic, ("L", mask), ("s", value)."""
        out = []
        for j, (e, p) in enumerate(zip(key, self.fpos, strict=True)):
            if e == 0 or (type(e) is tuple and e[0] == 2):
                out.append(0)
            elif e[0] == "L":
                out.append(e)
            else:
                out.append(("s", vals[p]))
            del j
        return out

    def _build(self, template: list, post: Callable | None):
        low, fnames, fkw = self.low, self.fnames, self.fkw

        def kernel(*dyn):
            it = iter(dyn)
            pos, kw = [], {}
            rng_key = rng.key_from_words(next(it)) if low.needs_rng else None
            for j, t in enumerate(template):
                if t == 0:
                    v = next(it)
                elif t[0] == "L":
                    v = [next(it) if m else None for m in t[1]]
                else:
                    v = t[1]
                if fkw[j]:
                    kw[fnames[j]] = v
                else:
                    pos.append(v)
            if rng_key is not None:
                kw["rng_key"] = rng_key
            out = low.fn(*pos, **kw)
            return post(out) if post is not None else out

        if low.checked:  # (acc: the running check record of Strict mode, `asserts.launch`)
            def checked_kernel(acc, seq, *dyn):
                out, record = run_checked(kernel, *dyn)
                return out, fold(acc, record, seq)

            return checked_kernel
        return kernel

    def _run(self, vals: list, extra_key: tuple = (), post: Callable | None = None, args: tuple | None = None):
        """Run the jitted kernel; raises Unsupported when the lowering refuses these arguments.

        `args`: the positional arguments of a call without keywords, remembered as a fast-path plan.
        """
        key, dyn = self._prepare(vals)
        if self.low.needs_rng:
            gen = None if self.gen_pos is None else vals[self.gen_pos]
            dyn.insert(0, rng.next_words() if gen is None else rng.next_words(rng.stream_of(gen)))
        k = (key, extra_key) if extra_key else key
        fn = self._fns.get(k)
        if fn is None:
            fn = self._fns[k] = cache.put((self.op, k), jax.jit(self._build(self._template(key, vals), post)))
        if args is not None:
            self._learn(args, key, fn)
        return self._launch(fn, dyn)

    def _launch(self, fn, dyn: list):
        n = fn._cache_size()
        out = fn(*dyn) if not self.checked else asserts.launch(fn, dyn, self.name)
        if fn._cache_size() != n:
            cache.record_compile(self.name)
        events.launches += 1
        if type(out) is tuple:
            for o in out:
                if o is not None:
                    _track(o)
        else:
            _track(out)
        if _state.blocking:
            jax.block_until_ready(out)
        return out

    def _learn(self, args: tuple, key: tuple, fn) -> None:
        """Remember how a keyword-free call with these argument types maps onto the kernel cache."""
        types = _types(args)
        plan = self._plans.get(types)
        if plan is False:
            return
        if plan is None:
            plan = self._plans[types] = _Plan.of(self, types, key)
            if plan is False:
                return
        vals = tuple([args[i] for i in plan.spos])
        if all(v == v for v in vals):  # a NaN would never match again
            plan.fns[vals] = fn

    def _fast(self, plan: _Plan, args: tuple):
        """The call through `plan`, or _MISS when its static arguments were not seen yet."""
        if plan.spos:
            fn = plan.fns.get(tuple([args[i] for i in plan.spos]))
            if fn is None:
                return _MISS
        else:
            fn = plan.fn
        if plan.all_tensors:
            dyn = list(map(tensor_value, args))
        else:
            dyn = [tensor_value(args[i]) if is_t else args[i] for i, is_t in plan.dpos]
        if plan.rng:
            dyn.insert(0, rng.next_words())
        return self._launch(fn, dyn)

    def call(self, args: tuple, kwargs: dict):
        out = _MISS
        if not kwargs and self._fast_ok:
            plan = self._plans.get(_types(args))
            if plan:
                out = self._fast(plan, args)
            if out is _MISS:
                out = self._run(self.sig.normalize(args, kwargs), args=args if plan is None or plan else None)
        else:
            out = self._run(self.sig.normalize(args, kwargs))
        if self.single:
            av = out.aval
            t = _create(av.shape, _NP_TO_TORCH[av.dtype])
            t.untyped_storage()._tpu = out
            return t
        return wrap_returns(out, self.sig.returns)


_MISS = object()


def host_args_to_device(sig: Signature, positions: tuple[int, ...], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) with the CPU tensors of the host-operand arguments at `positions` moved to the device,
    as CUDA moves CPU indices (`op_plan.HOST_OPERANDS`)."""
    args, kwargs = list(args), dict(kwargs)
    for i in positions:
        if i < len(args):
            args[i] = _to_device(args[i])
        elif sig.names[i] in kwargs:
            kwargs[sig.names[i]] = _to_device(kwargs[sig.names[i]])
    return tuple(args), kwargs


def _to_device(v):
    if isinstance(v, torch.Tensor):
        return v.to("tpu") if v.device.type == "cpu" else v
    if isinstance(v, list | tuple):
        return type(v)(_to_device(x) for x in v)
    return v


def _types(args: tuple) -> tuple:
    """tuple(map(type, args)), faster for the usual one or two arguments."""
    n = len(args)
    if n == 2:
        return (type(args[0]), type(args[1]))
    if n == 1:
        return (type(args[0]),)
    return tuple(map(type, args))


class _Plan:
    """How positional arguments of given types feed one op's kernels (the fast path of `LoweredOp.call`).

    `dpos`: (position, is_tensor) of each dynamic argument, in kernel order; `spos`: positions of static
    arguments, whose values key `fns` (the jitted function for those values). Arguments left out are
    defaults, always static.
    """

    __slots__ = ("dpos", "spos", "fns", "all_tensors", "rng")

    def __init__(self, dpos: list, spos: list, all_tensors: bool, rng_: bool) -> None:
        self.dpos, self.spos, self.all_tensors, self.rng = dpos, spos, all_tensors, rng_
        self.fns: dict[tuple, Callable] = {}

    @property
    def fn(self):
        return self.fns[()]

    @staticmethod
    def of(op: LoweredOp, types: tuple, key: tuple) -> _Plan | bool:
        """The plan for calls with these argument types, or False if their cache key depends on more than
        the static values (lists of tensors; Scalar arguments, dynamic unless equal to the default)."""
        dpos, spos = [], []
        for j, tv in enumerate(types):
            k, e = op.fkinds[j], key[j]
            if e == 0:
                if not issubclass(tv, torch.Tensor):
                    return False
                dpos.append((j, True))
            elif type(e) is tuple and e[0] == 2:
                if k is SC:  # dynamic only while the value differs from the default
                    return False
                dpos.append((j, False))
            elif type(e) is tuple and e[0] == "s" and tv in _SIMPLE:
                if k is SC and op.dyn_scalars and tv is not bool and tv is not type(None):
                    return False  # this value happened to equal the default
                spos.append(j)
            else:
                return False
        all_tensors = not spos and len(dpos) == len(types) and all(t for _, t in dpos)
        return _Plan(dpos, spos, all_tensors, op.low.needs_rng)


def wrap_returns(out, returns: list[str]):
    """Turn a lowering's JAX result(s) into what the schema returns (tensors, lists, Python scalars)."""
    if len(returns) == 1:
        return _wrap_one(out, returns[0])
    return tuple(_wrap_one(o, r) for o, r in zip(out, returns, strict=True))


def _wrap_one(o, ret: str):
    if o is None:
        return None
    if ret == "Tensor":
        return tt.from_jax(o)
    if ret.startswith("List[") or ret.endswith("[]"):
        return [tt.from_jax(x) for x in o]
    if ret in ("bool", "int", "float", "number", "complex"):
        return tt.jax_to_cpu(o, "item").item()
    return tt.from_jax(o)


class InplaceOp(LoweredOp):
    """`op_` : the functional lowering, cast to self's dtype, written back through self's view."""

    def call(self, args: tuple, kwargs: dict):
        vals = self.sig.normalize(args, kwargs)
        targets = written_tensors(vals, self.sig.written)
        dts = tuple(t.dtype for t in targets)
        shapes = tuple(tuple(t.shape) for t in targets)
        name = self.name

        def post(out):
            return cast_results(out, dts, shapes, name)

        out = self._run(vals, (dts, shapes), post)
        for t, o in zip(targets, out, strict=False):
            tt.write(t, o)
        n = len(self.sig.returns)
        return None if n == 0 else targets[0] if n == 1 else tuple(targets)


class OutOp(LoweredOp):
    """`op.out` : the functional lowering, then each result resized/cast into its out= tensor."""

    def call(self, args: tuple, kwargs: dict):
        vals = self.sig.normalize(args, kwargs)
        outs = [vals[i] for i in self.sig.written]
        dts = tuple(t.dtype for t in outs)
        name = self.name

        def post(out):
            return cast_results(out, dts, None, name)

        res = self._run(vals, (dts,), post)
        for t, o in zip(outs, res, strict=False):
            if tuple(t.shape) != o.shape:
                tt.resize(t, o.shape)
            tt.write(t, o)
        return outs[0] if len(outs) == 1 else tuple(outs)


# ---- choosing a handler ---------------------------------------------------------------------------

_local = threading.local()


class DecompOp:
    """Run PyTorch's decomposition of the op on the tpu tensors (it re-dispatches into smaller ops)."""

    def __init__(self, op, decomp, then_write: bool = False):
        self.op, self.decomp, self.then_write = op, decomp, then_write
        self.sig = Signature(op)

    def __call__(self, args: tuple, kwargs: dict):
        active = getattr(_local, "active", None)
        if active is None:
            active = _local.active = set()
        if self.op in active:  # the decomposition called the op itself: nothing smaller to go to
            return fallback.run_on_cpu(self.op, args, kwargs)
        active.add(self.op)
        try:
            if not self.then_write:
                out = self.decomp(*args, **kwargs)
                if out is NotImplemented:
                    return fallback.run_on_cpu(self.op, args, kwargs)
                return out
            return self._inplace(args, kwargs)
        finally:
            active.discard(self.op)

    def _inplace(self, args, kwargs):
        vals = self.sig.normalize(args, kwargs)
        f_kwargs = {}
        pos = []
        written = set(self.sig.written)
        for i, (v, ko) in enumerate(zip(vals, self.sig.kwarg_only, strict=True)):
            if i in written and ko:
                continue
            if ko:
                f_kwargs[self.sig.names[i]] = v
            else:
                pos.append(v)
        out = self.decomp(*pos, **f_kwargs)
        if out is NotImplemented:
            return fallback.run_on_cpu(self.op, args, kwargs)
        outs = out if isinstance(out, tuple | list) else (out,)
        targets = [vals[i] for i in self.sig.written]
        for t, o in zip(targets, outs, strict=False):
            if t.shape != o.shape:
                tt.resize(t, o.shape)
            t.copy_(o)
        return targets[0] if len(targets) == 1 else tuple(targets)


def choose(op: torch._ops.OpOverload) -> Handler:
    """Build (once) and remember the handler of `op` from its plan."""
    p = op_plan.plan(op)
    r = p.route
    if r is Route.KERNEL:
        h = op_plan.KERNELS[op]
    elif r is Route.LOWERED:
        h = LoweredOp(op, p.lowering)
    elif r is Route.INPLACE:
        h = InplaceOp(op, p.lowering, p.functional)
    elif r is Route.OUT:
        h = OutOp(op, p.lowering, p.functional)
    elif r is Route.DECOMPOSED_THEN_WRITE:
        h = DecompOp(op, p.decomposition, then_write=True)
    elif r is Route.DECOMPOSED:
        h = DecompOp(op, p.decomposition)
    else:
        h = fallback.CpuOp(op)
    if op_plan.is_like_factory(op):
        h = _LikeFactory(op, h)
    HANDLERS[op] = h
    return h


class _LikeFactory:
    """A `*_like` factory on a tpu input: made on the device `device=` names (`op_plan.like_elsewhere`), else
    by the tpu handler."""

    def __init__(self, op: torch._ops.OpOverload, h: Handler) -> None:
        self.op, self.h = op, h

    def __call__(self, args: tuple, kwargs: dict):
        out = op_plan.like_elsewhere(self.op, args, kwargs)
        return self.h(args, kwargs) if out is None else out


def boxed_fallback(keyset, op: torch._ops.OpOverload, *args, **kwargs):
    """The PrivateUse1 fallback: every op without a registered kernel arrives here."""
    h = HANDLERS.get(op)
    if h is None:
        h = choose(op)
    try:
        return h(args, kwargs)
    except _JaxError as e:
        raise _translate(e)  # noqa: B904 - out of memory becomes torch.OutOfMemoryError (cause kept)


def kernel_for(op: torch._ops.OpOverload) -> Callable:
    """A plain Python kernel (for torch.library registration) running `op`'s handler."""
    h = HANDLERS.get(op) or choose(op)
    k = h.direct_kernel() if type(h) is LoweredOp else _general_kernel(h)
    k.__name__ = f"tpu_{op._schema.name.split('::')[-1]}_{op._overloadname}"
    return k


def _guarded(h: Handler) -> Handler:
    """Handler `h` with JAX's out-of-memory error raised as torch.OutOfMemoryError."""

    def run(args: tuple, kwargs: dict):
        try:
            return h(args, kwargs)
        except _JaxError as e:
            raise _translate(e)  # noqa: B904 - the JAX error stays the cause

    return run


def _general_kernel(h: Handler) -> Callable:
    """A Python kernel calling handler `h` (JAX's out-of-memory error raised as torch.OutOfMemoryError)."""

    def kernel(*args, **kwargs):
        try:
            return h(args, kwargs)
        except _JaxError as e:
            raise _translate(e)  # noqa: B904 - out of memory becomes torch.OutOfMemoryError (cause kept)

    return kernel
