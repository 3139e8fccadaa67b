"""Fused mode's disk cache: what a new process needs to run a step it has run before without tracing it again.

A Fused trace is a path through a trie of node descriptions (`tputool.backend.fused._Step`). Each trie node
gets a key that survives the process: a hash of its parent's key and the text of its description (op name,
static arguments, input wiring, shapes and dtypes: no Python ids or addresses; a description whose text
holds an address, " at 0x", gets no key, nor does anything below it). Under those keys this module keeps,
in `$TPUTOOL_CACHE_DIR/fused` (or `~/.cache/tputool/fused`; `TPUTOOL_CACHE_DIR=off` turns it off):

- the output shapes of each recorded node (one JSON-lines file per code fingerprint, appended to), so
  recording a known step in a new process needs no abstract evaluation of its ops (`jax.eval_shape`, a trace per op);
- each fused computation's compiled executable (`jax.experimental.serialize_executable`), so its flush
  loads it instead of tracing, lowering and compiling (JAX's own persistent cache still has to trace and
  lower a computation to find its key).

The root key is a fingerprint of the code that gives the shapes and the programs their meaning: the versions of
tputool, torch, jax and jaxlib, JAX's x64 flag, and the size and modification time of every file of
`tputool/backend`; an executable's key adds the process's devices. Executables are not kept in a multi-process
run (JAX's distributed runtime), where the shapes still are. Anything unreadable, stale or failing to load is
ignored and rebuilt: the cache can only save time.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax

from tputool.backend import executables

_state: dict[str, Any] = {"root": None, "dir": None, "shapes": None, "new": {}, "off": False}


def _fingerprint() -> str | None:
    root = os.environ.get("TPUTOOL_CACHE_DIR")
    if root is not None and root.lower() == "off":
        return None
    import jaxlib
    import torch

    import tputool

    h = hashlib.sha256(f"{tputool.__version__} {torch.__version__} {jax.__version__} {jaxlib.__version__} "
                       f"{jax.config.jax_enable_x64}".encode())
    backend = Path(__file__).parent
    for p in sorted(backend.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(backend)} {st.st_size} {st.st_mtime_ns}\n".encode())
    _state["dir"] = Path(root) / "fused" if root else Path.home() / ".cache" / "tputool" / "fused"
    return h.hexdigest()[:32]


def root_key() -> str | None:
    """The key of the trie's root (the code fingerprint), or None when the disk cache is off."""
    if _state["root"] is None:
        _state["root"] = _fingerprint() or ""
    return _state["root"] or None


def child_key(parent: str | None, desc: Any) -> str | None:
    """The key of the trie node reached from `parent` by node description `desc` (None: not kept)."""
    if parent is None or _state["off"] or root_key() is None:
        return None
    text = repr(desc)
    if " at 0x" in text:
        return None
    return hashlib.sha256(f"{parent}\x00{text}".encode()).hexdigest()[:32]


# -- shapes -----------------------------------------------------------------------------------------------

def _encode(s: Any) -> Any:
    if s is None:
        return None
    if isinstance(s, tuple | list):
        return {"tuple" if isinstance(s, tuple) else "list": [_encode(x) for x in s]}
    return [list(s.shape), str(s.dtype), bool(getattr(s, "weak_type", False))]


def _decode(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, dict):
        (kind, items), = v.items()
        out = [_decode(x) for x in items]
        return tuple(out) if kind == "tuple" else out
    shape, dtype, weak = v
    return jax.ShapeDtypeStruct(tuple(shape), jax.numpy.dtype(dtype), weak_type=weak)


def _shapes_path() -> Path:
    root_key()
    return _state["dir"] / f"shapes-{_state['root']}.jsonl"


def _load_shapes() -> dict:
    if _state["shapes"] is None:
        known: dict = {}
        try:
            with open(_shapes_path(), "rb") as f:
                for line in f:
                    try:
                        k, v = json.loads(line)
                    except ValueError:
                        continue  # (a line cut short by a crash: its entries are learnt again)
                    known[k] = v
        except OSError:
            pass
        _state["shapes"] = known
    return _state["shapes"]


def shapes(key: str) -> Any:
    """The recorded output shapes of the trie node `key` (jax.ShapeDtypeStructs as eval_shape gives them), or
    None when not on disk."""
    v = _load_shapes().get(key)
    if v is None:
        return None
    try:
        return _decode(v)
    except (TypeError, ValueError, KeyError):
        return None


def remember_shapes(key: str, out: Any) -> None:
    """Keep the output shapes `out` of trie node `key`; written to disk by `save_shapes`."""
    v = _encode(out)
    _load_shapes()[key] = v
    _state["new"][key] = v


def save_shapes() -> None:
    """Append the shapes learnt since the last save to the fingerprint's file (one JSON line per node, written
    with one append: processes sharing the directory add their lines whole)."""
    new = _state["new"]
    if not new:
        return
    _state["new"] = {}
    data = "".join(json.dumps([k, v], separators=(",", ":")) + "\n" for k, v in new.items()).encode()
    path = _shapes_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# -- executables ------------------------------------------------------------------------------------------

def trace_key(step_key: str | None, outs: tuple, donate: tuple, checked: frozenset) -> str | None:
    """The key of the fused computation of a trace ending at trie node `step_key`, returning `outs`, donating
    `donate`, with check records of the `checked` nodes; None when not kept."""
    if step_key is None or _state["off"] or root_key() is None or jax.process_count() > 1:
        return None  # (across processes a program lowered ahead of its call is placed for every process's devices)
    devices = [(d.platform, d.id) for d in jax.local_devices()]
    text = f"{step_key}\x00{outs}\x00{donate}\x00{sorted(checked)}\x00{devices}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _exe_path(key: str) -> Path:
    root_key()
    return _state["dir"] / f"exe-{key}.bin"


def load(key: str, device: Any = None) -> Any:
    """The compiled executable kept under `key` (a `jax.stages.Compiled`) placed on `device` (default: the first
    device; JAX's own default is every device of the process, which a one-device program on a host with several
    refuses to run: "Expected args ... to have 8 shards"), or None."""
    from jax.experimental import serialize_executable

    if _state["off"]:
        return None
    try:
        payload, in_tree, out_tree = pickle.loads(_exe_path(key).read_bytes())
        exe = serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                        execution_devices=[device or jax.devices()[0]])
    except Exception:  # noqa: BLE001 - missing, truncated, stale or from another jaxlib: compile again
        return None
    executables.count()
    return exe


def save(key: str, compiled: Any) -> None:
    """Keep `compiled` (a `jax.stages.Compiled`) under `key`; a failure only loses the saving."""
    from jax.experimental import serialize_executable

    if _state["off"]:
        return
    try:
        _write(_exe_path(key), pickle.dumps(serialize_executable.serialize(compiled)))
    except Exception:  # noqa: BLE001 - e.g. a read-only cache directory, an executable that cannot serialize
        pass


def lowerings_changed() -> None:
    """A lowering was registered: one from outside tputool's backend (a program's own, not in the fingerprint)
    registered after traces were keyed means keeping nothing more on disk, and loading nothing, in this process."""
    if _state["root"] is None or _state["off"]:
        return
    backend = str(Path(__file__).parent)
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(backend + os.sep + "lowerings" + os.sep + "__init__"):
        f = f.f_back
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    if f is None or not f.f_code.co_filename.startswith(backend + os.sep):
        _state["off"] = True


def reset() -> None:
    """Forget the fingerprint and the loaded shapes (tests change TPUTOOL_CACHE_DIR)."""
    _state.update(root=None, dir=None, shapes=None, new={}, off=False)
