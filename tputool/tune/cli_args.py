"""Parse the tune/profile command-line values (`1,2,4`, `plain,chunked:16`, `dim=128`) into library types."""

from __future__ import annotations

import ast
import re
from typing import Any

from tputool.errors import UserError
from tputool.tune.candidate import ATTENTION_IMPLS, PRECISIONS, REMAT_POLICIES
from tputool.tune.space import SearchSpace


def _items(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4); positive ints only."""
    try:
        vals = tuple(int(t) for t in _items(text))
    except ValueError as e:
        raise UserError(f"{what}: expected comma-separated integers, got '{text}'") from e
    if not vals or min(vals) < 1:
        raise UserError(f"{what}: expected positive integers, got '{text}'")
    return vals


def parse_choices(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """`none,full` -> ('none', 'full'), each in `allowed`."""
    vals = tuple(_items(text))
    bad = [v for v in vals if v not in allowed]
    if not vals or bad:
        raise UserError(f"{what}: '{text}' is not a list of {', '.join(allowed)}")
    return vals


def parse_attention(text: str) -> tuple[tuple[str, int], ...] | None:
    """`plain,chunked:512,splash:1024` -> (('plain', 0), ('chunked', 512), ('splash', 1024)); `auto` -> None
    (choose from the sequence length)."""
    if text.strip() == "auto":
        return None
    out = []
    for item in _items(text):
        impl, _, block = item.partition(":")
        if impl not in ATTENTION_IMPLS:
            raise UserError(f"--attention: unknown implementation '{impl}' (use auto, plain, chunked:BLOCK, "
                            "flash:BLOCK or splash:BLOCK)")
        if impl == "plain":
            out.append(("plain", 0))
        else:
            if not block.isdigit() or int(block) < 1:
                raise UserError(f"--attention: {impl} needs a block size, e.g. {impl}:512 (got '{item}')")
            out.append((impl, int(block)))
    if not out:
        raise UserError("--attention: empty list")
    return tuple(out)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`dim=128 tie_embeddings=False` -> {'dim': 128, 'tie_embeddings': False} (Python literals, else str)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"--set: expected FIELD=VALUE, got '{item}'")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


_MESH = re.compile(r"^d(\d+)f(\d+)t(\d+)$")


def parse_meshes(text: str | None) -> tuple[tuple[int, int, int], ...] | None:
    """`d8f1t1,d2f4t1` -> ((8, 1, 1), (2, 4, 1)); None stays None (every mesh)."""
    if text is None:
        return None
    out = []
    for item in _items(text):
        m = _MESH.match(item)
        if not m:
            raise UserError(f"--mesh: expected dDATAfFSDPtTENSOR like d2f4t1, got '{item}'")
        out.append(tuple(int(g) for g in m.groups()))
    if not out:
        raise UserError("--mesh: empty list")
    return tuple(out)


def build_space(batches: str, remat: str, attention: str, precision: str, max_tensor: int | None,
                mesh: str | None = None, global_batch: int | None = None) -> SearchSpace:
    """A SearchSpace from the CLI strings."""
    if global_batch is not None and global_batch < 1:
        raise UserError(f"--global-batch must be >= 1, got {global_batch}")
    remats = None if remat.strip() == "auto" else parse_choices(remat, REMAT_POLICIES, "--remat")
    return SearchSpace(meshes=parse_meshes(mesh), global_batch=global_batch,
        batches=parse_ints(batches, "--batch"), remats=remats,
        attentions=parse_attention(attention), precisions=parse_choices(precision, PRECISIONS, "--precision"),
        max_tensor=max_tensor,
    )
