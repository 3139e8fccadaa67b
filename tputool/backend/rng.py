"""The tpu backend's random streams: a seed plus a counter; each random op gets key(seed) folded with the counter.

The (seed, counter) pair travels into the op's compiled kernel as one small uint32 array, so drawing a key
costs no extra dispatch, and `get_state`/`set_state` (torch.tpu.get_rng_state) capture it exactly.

The default stream lives in `runtime.STATE` (seeded by torch.manual_seed / torch.tpu.manual_seed). Each
`torch.Generator(device="tpu")` is a `TpuGenerator` with a stream of its own (`Stream`), drawn from by the ops
it is passed to (`stream_of`): the same seed gives the same values as the default stream with that seed.
Ops that run on the CPU fallback draw from a CPU generator seeded from the tpu stream (`cpu_generator`).

With `TPUTOOL_RANDOM=host` (`HOST_RANDOM`; `tputool parity` sets it for its tpu run) every random op on tpu runs on
the CPU fallback and draws from PyTorch's CPU default generator (`generator=None`), so a script draws the values it
draws on CPU, in the same order: dropout masks, noise and random initializations then equal the reference's.
"""

from __future__ import annotations

import hashlib
import os
import weakref

import jax
import numpy as np
import torch

from tputool.backend.runtime import DEFAULT_SEED, STATE

__all__ = ["DEFAULT_SEED", "Stream", "TpuGenerator", "manual_seed", "next_words", "key_from_words", "get_state",
           "set_state", "stream_of", "cpu_generator", "install_generator"]

HOST_RANDOM = os.environ.get("TPUTOOL_RANDOM", "") == "host"
"""Random ops on tpu draw from the CPU default generator (see the module doc), read once at import."""

_U64 = 0xFFFF_FFFF_FFFF_FFFF


class Stream:
    """A random stream of its own (a tpu generator's): the same two fields as the default one in STATE."""

    __slots__ = ("rng_seed", "rng_counter")

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self.rng_seed, self.rng_counter = seed, 0


def manual_seed(s: int, stream=STATE) -> None:
    """Restart `stream` (the default one unless given) from seed `s`."""
    stream.rng_seed, stream.rng_counter = int(s) & _U64, 0


def next_words(stream=STATE) -> np.ndarray:
    """The words of the next key of `stream` (and advance it): [seed_hi, seed_lo, counter] as uint32."""
    c, seed = stream.rng_counter, stream.rng_seed
    stream.rng_counter = (c + 1) & 0xFFFF_FFFF
    return np.array([seed >> 32, seed & 0xFFFF_FFFF, c], dtype=np.uint32)


def key_from_words(words: jax.Array) -> jax.Array:
    """The JAX key for `next_words()`'s output (traceable, used inside compiled kernels)."""
    k = jax.random.key(0, impl="threefry2x32")
    k = jax.random.fold_in(k, words[0])
    k = jax.random.fold_in(k, words[1])
    return jax.random.fold_in(k, words[2])


def get_state(stream=STATE) -> torch.Tensor:
    """The stream's state as a CPU uint8 tensor (16 bytes: seed and counter, little-endian uint64)."""
    return torch.from_numpy(np.array([stream.rng_seed, stream.rng_counter], dtype="<u8").view(np.uint8).copy())


def set_state(state: torch.Tensor, stream=STATE) -> None:
    """Restore a state returned by `get_state`."""
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"tpu rng state must be a torch.ByteTensor, got {type(state).__name__}")
    arr = state.detach().cpu().contiguous().numpy()
    if arr.dtype != np.uint8 or arr.size != 16:
        raise ValueError("tpu rng state must be the 16-byte uint8 tensor returned by torch.tpu.get_rng_state()")
    stream.rng_seed, stream.rng_counter = (int(v) for v in arr.view("<u8"))


def stream_of(generator) -> Stream:
    """The stream an op passed `generator=` draws from: the default one for None, the generator's own for a tpu
    generator; another device's generator raises, as CUDA's ops refuse a CPU generator."""
    if generator is None:
        return STATE
    s = _STREAMS.get(generator._cdata)  # (an op receives a new Python object for the same C generator)
    if s is None:
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{generator.device.type}'")
    return s


def cpu_generator(generator) -> torch.Generator:
    """A CPU generator for an op that runs on the CPU fallback, seeded from the tpu stream `generator=` names
    (None: the default one), which advances by one draw: reproducible from the tpu seed, as a tpu kernel is.
    Under `HOST_RANDOM`, None is PyTorch's CPU default generator itself."""
    if generator is None and HOST_RANDOM:
        return torch.default_generator
    words = next_words(stream_of(generator))
    seed = int.from_bytes(hashlib.blake2b(words.tobytes(), digest_size=8).digest(), "little")
    return torch.Generator().manual_seed(seed)


# ---- torch.Generator(device="tpu") ---------------------------------------------------------------------

_TorchGenerator = torch._C.Generator

_STREAMS: dict[int, Stream] = {}
"""The stream of each live tpu generator, by its C generator's address (`_cdata`)."""


def _tpu_index(device) -> int | None:
    """The tpu device index `device` names (0 when it names none), or None for another device type."""
    if device is None:
        return None
    d = device if isinstance(device, torch.device) else torch.device(device)
    return None if d.type != "tpu" else (d.index or 0)


class TpuGenerator(_TorchGenerator):
    """A generator of the tpu device: a random stream (`Stream`) that random ops on tpu draw from when passed
    as `generator=`. (Underneath it is a CPU generator object, which torch's argument parsing requires; its
    state is unused.)"""

    def __new__(cls, index: int = 0, stream: Stream | None = None):
        return super().__new__(cls)  # (torch's generator on the CPU: an int argument would name a CUDA device)

    def __init__(self, index: int = 0, stream: Stream | None = None) -> None:
        super().__init__()
        self._tpu_index = index
        self._tpu_stream = Stream() if stream is None else stream
        _STREAMS[self._cdata] = self._tpu_stream
        weakref.finalize(self, _STREAMS.pop, self._cdata, None)

    @property
    def device(self) -> torch.device:
        """The tpu device this generator belongs to."""
        return torch.device("tpu", self._tpu_index)

    def manual_seed(self, seed: int) -> TpuGenerator:
        """Restart the stream from `seed` (returns self, as torch.Generator.manual_seed does)."""
        manual_seed(seed, self._tpu_stream)
        return self

    def seed(self) -> int:
        """Seed the stream with a non-deterministic number, and return it."""
        s = int.from_bytes(os.urandom(8), "little")
        manual_seed(s, self._tpu_stream)
        return s

    def initial_seed(self) -> int:
        """The seed the stream started from."""
        return self._tpu_stream.rng_seed

    def get_state(self) -> torch.Tensor:
        """The stream's state (a 16-byte CPU uint8 tensor: seed and counter)."""
        return get_state(self._tpu_stream)

    def set_state(self, new_state: torch.Tensor) -> TpuGenerator:
        """Restore a state from `get_state` (returns self)."""
        set_state(new_state, self._tpu_stream)
        return self

    def get_offset(self) -> int:
        """How many keys the stream has drawn since its seed."""
        return self._tpu_stream.rng_counter

    def set_offset(self, offset: int) -> TpuGenerator:
        """Move the stream to draw key number `offset` next (returns self)."""
        self._tpu_stream.rng_counter = int(offset) & 0xFFFF_FFFF
        return self

    def clone_state(self) -> TpuGenerator:
        """A new tpu generator whose stream starts where this one is."""
        return TpuGenerator(self._tpu_index).set_state(self.get_state())

    def graphsafe_get_state(self):
        raise RuntimeError("graphsafe_get_state is for CUDA graphs; a tpu generator has get_state/set_state")

    def graphsafe_set_state(self, state):
        raise RuntimeError("graphsafe_set_state is for CUDA graphs; a tpu generator has get_state/set_state")

    def __reduce__(self):
        return _restore, (self._tpu_index, bytes(self.get_state().numpy()))

    def __repr__(self) -> str:
        return f"<tpu Generator {self.device} seed={self.initial_seed()}>"


def _restore(index: int, state: bytes) -> TpuGenerator:
    return TpuGenerator(index).set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


class _GeneratorType(type(_TorchGenerator)):
    """The metaclass of `Generator`: construction picks the device's class, and every generator (torch's own
    ones included) is an instance of it."""

    def __call__(cls, device=None):
        index = _tpu_index(device)
        if index is not None:
            return TpuGenerator(index)
        return _TorchGenerator() if device is None else _TorchGenerator(device)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _TorchGenerator)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _TorchGenerator)


class Generator(_TorchGenerator, metaclass=_GeneratorType):
    """`torch.Generator` once the tpu device is registered: `Generator(device="tpu")` makes a `TpuGenerator`,
    any other device torch's own generator (what `torch.Generator` was)."""


def install_generator() -> None:
    """Make `torch.Generator` the class above (idempotent)."""
    Generator.__doc__ = _TorchGenerator.__doc__
    Generator.__module__ = "torch"
    torch.Generator = Generator
