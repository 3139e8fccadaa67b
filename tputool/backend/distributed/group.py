"""The multi-process ProcessGroup of the tpu device: torch.distributed's collectives on JAX's runtime.

One rank = one process = one device (the process's first local device, where its eager tpu tensors live;
further local devices are used inside the process through SPMD sharding). Each collective exchanges its
signature through the store (`handshake`), then runs one cached jitted program (`programs`) over the group's
devices: gloo between processes on CPU, ICI/DCN on TPU. Work is dispatched asynchronously, as on a CUDA
stream: the returned Work is complete, its future holds the output tensors, and reading them waits.
CPU tensors are accepted (copied to the device and back), so barrier and the object collectives work too.
Point-to-point send/recv is a 2-device program (ppermute) between the two processes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from datetime import timedelta

import jax
import torch
import torch.distributed as dist

from tputool.backend import tensor as tt
from tputool.backend.distributed import jax_runtime, liveness, programs
from tputool.backend.distributed.faults import Guard
from tputool.backend.distributed.handshake import Handshake
from tputool.backend.distributed.single import NamedProcessGroup, done
from tputool.backend.tpu_api import _bridge

_REASON = "collective"
_READ_WAIT = timedelta(seconds=5)
"""How long a rank that found a send/recv mismatch waits for its peer to read its half before raising."""


def _array(t: torch.Tensor) -> jax.Array:
    """The JAX value of `t` (a tpu tensor's own buffer, or a CPU tensor's copy) as a block of >= 1 dimension."""
    a = _bridge.arrays([t], _REASON)[0] if t.device.type == "tpu" else tt.cpu_to_jax(t, count=False)
    return a.reshape(1) if a.ndim == 0 else a


def _put(t: torch.Tensor, a: jax.Array) -> None:
    """Make `a` (reshaped to `t`) the value of `t`."""
    if a.shape != t.shape:
        a = a.reshape(t.shape)
    if t.device.type == "tpu":
        _bridge.store(t, a)
    else:
        t.copy_(tt.jax_to_cpu(a, count=False))


def _desc(ts: Sequence[torch.Tensor]) -> str:
    return ",".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in ts)


def _op(opts) -> tuple[str, float | None]:
    """torch's ReduceOp in `opts` as (name, PREMUL_SUM's factor)."""
    r = opts.reduceOp
    kind = r.op if isinstance(r, dist.ReduceOp) else r
    name = kind.name
    if name != "PREMUL_SUM":
        return name, None
    f = r.factor
    return name, float(f.item() if isinstance(f, torch.Tensor) else f)


class TpuProcessGroup(NamedProcessGroup):
    """A group of `size` processes over JAX's distributed runtime (see the module docstring)."""

    def __init__(self, name: str, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._name = name
        self._hs = Handshake(store, rank, size, timeout, f"tpu process group (rank {rank} of {size})")
        procs = self._hs.exchange("procs", str(jax.process_index()), "process group creation")
        first: dict[int, jax.Device] = {}
        for d in jax.devices():
            first.setdefault(d.process_index, d)
        self._devices = tuple(first[int(p)] for p in procs)
        self._guard = Guard(self._hs)
        self._cache: dict[tuple, Callable[..., list[jax.Array]]] = {}
        self._p2p: dict[int, int] = {}
        liveness.start(store, rank)

    @property
    def guard(self) -> Guard:
        """Runs this group's programs with a bounded wait and names the ranks that stopped (`faults.Guard`)."""
        return self._guard

    def getBackendName(self) -> str:  # noqa: N802 - torch's API name
        """The registered backend name this group was created under."""
        return self._name

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        """Each rank's device, in group rank order (its process's first device)."""
        return self._devices

    def check(self, call: str) -> None:
        """Exchange the signature `call` of a program every rank runs (a compiled graph's collectives) through
        the store, as before each collective: a missing rank or a different call is named in a RuntimeError."""
        self._hs.check(call)

    def _program(self, kind: str, a: jax.Array, *params) -> Callable[..., list[jax.Array]]:
        """The collective `kind` for blocks like `a`, run through the group's guard (cached)."""
        key = (kind, a.shape, a.dtype, params)
        prog = self._cache.get(key)
        if prog is None:
            compiled = programs.program(self._devices, kind, a.shape, a.dtype, *params)
            prog = self._cache[key] = functools.partial(self._guard.run, compiled)
        return prog

    # ---- reductions and broadcasts ------------------------------------------------------------------

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """Every rank's tensors become the reduction over ranks (any ReduceOp; PREMUL_SUM scales first)."""
        op, factor = _op(opts) if opts is not None else ("SUM", None)
        self._hs.check(f"all_reduce({op}) {_desc(tensors)}")
        for t in tensors:
            a = _array(t)
            _put(t, self._program("all_reduce", a, op, factor)(a)[0])
        return done(list(tensors))

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """As allreduce, for a list of tensors."""
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """The reduction lands on the root rank; the others' tensors are left as they were."""
        op, factor = _op(opts)
        root = opts.rootRank
        self._hs.check(f"reduce({op}, dst={root}) {_desc(tensors)}")
        for t in tensors:
            a = _array(t)
            out = self._program("all_reduce", a, op, factor)(a)[0]
            if self.rank() == root:
                _put(t, out)
        return done(list(tensors))

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """The root rank's tensors, bit for bit, on every rank."""
        root = opts.rootRank if opts is not None else 0
        self._hs.check(f"broadcast(src={root}) {_desc(tensors)}")
        for t in tensors:
            a = _array(t)
            out = self._program("broadcast", a, root)(a)[0]
            if self.rank() != root:
                _put(t, out)
        return done(list(tensors))

    def barrier(self, opts: object = None) -> dist.Work:
        """Every rank has reached it (the signature exchange) and the runtime's collectives flow (a tiny
        all-reduce, waited for)."""
        self._hs.check("barrier()")
        a = jax.numpy.zeros((1,), jax.numpy.int32)
        self._program("all_reduce", a, "SUM", None)(a)[0].block_until_ready()
        return done()

    # ---- gathers and scatters -----------------------------------------------------------------------

    def allgather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                  opts: object = None) -> dist.Work:
        """outputs[i][r] <- rank r's inputs[i]."""
        self._hs.check(f"all_gather {_desc(inputs)}")
        for outs, t in zip(outputs, inputs, strict=True):
            a = _array(t)
            for o, v in zip(outs, self._program("all_gather", a, 1)(a), strict=True):
                _put(o, v)
        return done(list(outputs))

    def allgather_coalesced(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                            opts: object = None) -> dist.Work:
        """As allgather, for a list of tensors."""
        return self.allgather(outputs, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> dist.Work:
        """all_gather_into_tensor: the ranks' inputs concatenated (or stacked) in rank order into `output`."""
        self._hs.check(f"all_gather_into_tensor {_desc([input])}->{_desc([output])}")
        a = _array(input)
        _put(output, self._program("all_gather", a, 0)(a)[0])
        return done([output])

    def all_gather_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                    opts: object = None) -> dist.Work:
        """As all_gather_single, for lists of tensors."""
        for out, inp in zip(outputs, inputs, strict=True):
            self.all_gather_single(out, inp, opts)
        return done(list(outputs))

    def gather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
               opts: object = None) -> dist.Work:
        """On the root rank, outputs[0][r] <- rank r's input (an all-gather the others discard)."""
        root = opts.rootRank
        self._hs.check(f"gather(dst={root}) {_desc(inputs)}")
        for i, t in enumerate(inputs):
            a = _array(t)
            got = self._program("all_gather", a, 1)(a)
            if self.rank() == root:
                for o, v in zip(outputs[i], got, strict=True):
                    _put(o, v)
        return done(list(outputs))

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                       opts: object = None) -> dist.Work:
        """outputs[i] <- the reduction over ranks of their inputs[i][this rank]."""
        op, factor = _op(opts)
        self._hs.check(f"reduce_scatter({op}) {_desc(outputs)}")
        for out, parts in zip(outputs, inputs, strict=True):
            a = jax.numpy.concatenate([_array(p) for p in parts])
            _put(out, self._program("reduce_scatter", a, op, factor)(a)[0])
        return done(list(outputs))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> dist.Work:
        """reduce_scatter_tensor: this rank's 1/n (along dimension 0) of the reduction of the ranks' inputs."""
        op, factor = _op(opts)
        self._hs.check(f"reduce_scatter_tensor({op}) {_desc([input])}->{_desc([output])}")
        a = _array(input)
        n = self.size()
        if a.shape[0] % n:  # stacked (n, *output.shape) or any other layout: split the flat elements
            a = a.reshape(n, -1)
        _put(output, self._program("reduce_scatter", a, op, factor)(a)[0])
        return done([output])

    def reduce_scatter_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: object = None) -> dist.Work:
        """As reduce_scatter_single, for lists of tensors."""
        for out, inp in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, inp, opts)
        return done(list(outputs))

    def scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                opts: object = None) -> dist.Work:
        """outputs[0] <- the root's inputs[0][this rank]."""
        root = opts.rootRank
        out = outputs[0]
        self._hs.check(f"scatter(src={root}) {_desc([out])}")
        if self.rank() == root:
            a = jax.numpy.concatenate([_array(p) for p in inputs[0]])
        else:
            shape = (self.size() * max(1, out.dim() and out.shape[0]), *out.shape[1:])
            a = jax.numpy.zeros(shape, _array(out).dtype)
        _put(out, self._program("scatter", a, root)(a)[0])
        return done([out])

    # ---- all-to-all -----------------------------------------------------------------------------------

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None,
                          input_split_sizes: list[int] | None, opts: object = None) -> dist.Work:
        """Rank r's i-th chunk of `input` (along dimension 0; `input_split_sizes` rows, or equal) goes to rank i,
        which stores it as its r-th chunk of `output`."""
        n = self.size()
        a = _array(input)
        if not input_split_sizes and not output_split_sizes:
            self._hs.check(f"all_to_all_single {_desc([input])}->{_desc([output])}")
            _put(output, self._program("all_to_all", a, )(a)[0])
            return done([output])
        sends = list(input_split_sizes or [a.shape[0] // n] * n)
        extras = self._hs.check(f"all_to_all_single(uneven) {str(input.dtype)}{list(input.shape[1:])}",
                                ",".join(map(str, sends)), need=True)
        rows = tuple(tuple(int(x) for x in e.split(",")) for e in extras)
        longest = max(sum(r) for r in rows)
        if a.shape[0] < longest:
            a = jax.numpy.pad(a, [(0, longest - a.shape[0])] + [(0, 0)] * (a.ndim - 1))
        got = self._program("all_to_all_v", a, rows)(a)[0]
        mine = sum(rows[j][self.rank()] for j in range(n))
        _put(output, got[:mine])
        return done([output])

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                 opts: object = None) -> dist.Work:
        """outputs[r] <- rank r's inputs[this rank] (any sizes: flattened through all_to_all_single)."""
        n = self.size()
        flat_in = jax.numpy.concatenate([_array(t).reshape(-1) for t in inputs])
        sends = [t.numel() for t in inputs]
        extras = self._hs.check(f"all_to_all {str(inputs[0].dtype)}", ",".join(map(str, sends)), need=True)
        rows = tuple(tuple(int(x) for x in e.split(",")) for e in extras)
        longest = max(sum(r) for r in rows)
        a = jax.numpy.pad(flat_in, (0, longest - flat_in.shape[0])) if flat_in.shape[0] < longest else flat_in
        got = self._program("all_to_all_v", a, rows)(a)[0]
        off = 0
        for r in range(n):
            k = rows[r][self.rank()]
            _put(outputs[r], got[off:off + k])
            off += k
        return done(list(outputs))

    # ---- point to point ---------------------------------------------------------------------------------

    def _pair(self, src: int, dst: int, t: torch.Tensor, tag: int) -> None:
        """Move `t` from group rank `src` to `dst` (both call this): a 2-device ppermute program, after the two
        exchange (shape, dtype, tag) through the store (when the checks are on, or for a non-zero tag)."""
        sending = self.rank() == src
        peer = dst if sending else src
        k = self._p2p[peer] = self._p2p.get(peer, 0) + 1
        what = f"send #{k} to rank {dst}" if sending else f"recv #{k} from rank {src}"
        if self._hs.checks or tag:
            self._p2p_check(src, dst, f"p2p/{src}-{dst}/{k}/", what, f"{_desc([t])} tag {tag}")
        a = _array(t)
        key = ("send", a.shape, a.dtype, (src, dst))
        prog = self._cache.get(key)
        if prog is None:
            pair = (self._devices[src], self._devices[dst])
            prog = self._cache[key] = programs.program(pair, "send", a.shape, a.dtype)
        out = self._guard.run(prog, a, what=what, ranks=(src, dst))[0]
        if self.rank() == dst:
            _put(t, out)

    def _p2p_check(self, src: int, dst: int, prefix: str, what: str, sig: str) -> None:
        """Both sides of a transfer src -> dst post `sig` under `prefix` and read the other's: a missing peer
        (at the timeout) or a different shape, dtype or tag raises on both ranks, before any data moves."""
        hs = self._hs
        sending = self.rank() == src
        peer = dst if sending else src
        mine, theirs = (prefix + "s", prefix + "r") if sending else (prefix + "r", prefix + "s")
        hs.store.set(mine, sig)
        try:
            hs.store.wait([theirs], hs.timeout)
        except Exception:  # noqa: BLE001 - timeout, or the store's host gone
            msg = (f"{hs.name}: {what}: rank {peer} did not {'recv' if sending else 'send'} within the timeout "
                   f"({hs.timeout.total_seconds():g}s)")
            jax_runtime.mark_failed(msg)
            raise dist.DistBackendError(msg) from None
        other = hs.store.get(theirs).decode()
        hs.store.delete_key(theirs)
        if other != sig:
            sent, expected = (sig, other) if sending else (other, sig)
            msg = (f"{hs.name}: {what} does not match: rank {src} sends {sent} but rank {dst} receives {expected}")
            jax_runtime.mark_failed(msg)
            hs.store.set(f"{mine}/read", "")  # (the store may live in this process: let the peer read first)
            with contextlib.suppress(Exception):
                hs.store.wait([f"{theirs}/read"], min(hs.timeout, _READ_WAIT))
            raise RuntimeError(msg)

    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int) -> dist.Work:
        """Send tensors[0] to group rank `dst` (which calls recv with the same tag)."""
        self._pair(self.rank(), dst, tensors[0], tag)
        return done(list(tensors))

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int) -> dist.Work:
        """Receive tensors[0] from group rank `src` (which calls send with the same tag)."""
        self._pair(src, self.rank(), tensors[0], tag)
        return done(list(tensors))
