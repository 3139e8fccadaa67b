"""The layout ARCHITECTURE.md describes, checked from the code's own imports (ast, nothing imported).

- no two top-level packages of tputool import each other (at any depth, lazily or not);
- one module decides how an ATen op runs: only `backend/op_plan.py` reads `torch._decomp`'s table;
- one module builds a `jax.sharding.Mesh`: `tputool/mesh.py`;
- only `tputool/cli/` imports Typer (libraries hold no command-line code).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tputool"
PACKAGES = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}


def _modules():
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        yield rel, f.read_text(encoding="utf-8")


def _imported(rel: Path, tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel.parts[:-1])[: len(rel.parts) - node.level]
                yield ".".join(["tputool", *base, node.module or ""]).rstrip(".")
            else:
                yield node.module or ""


def test_no_package_cycles():
    edges = set()
    for rel, src in _modules():
        me = rel.parts[0] if len(rel.parts) > 1 else None
        for name in _imported(rel, ast.parse(src)):
            parts = name.split(".")
            if me and parts[0] == "tputool" and len(parts) > 1 and parts[1] in PACKAGES and parts[1] != me:
                edges.add((me, parts[1]))
    cycles = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
    assert not cycles, f"packages importing each other: {cycles}"


def test_one_module_reads_pytorchs_decompositions():
    readers = [str(rel) for rel, src in _modules() if "decomposition_table" in src
               and rel.parts[0] in ("backend", "tune")]
    assert readers == ["backend/op_plan.py"], readers


def test_one_module_builds_meshes():
    builders = [str(rel) for rel, src in _modules() if re.search(r"(?<![\w.])(jax\.sharding\.)?Mesh\(", src)]
    assert builders == ["mesh.py"], builders


def test_only_the_cli_imports_typer():
    users = [str(rel) for rel, src in _modules()
             if any(n.split(".")[0] == "typer" for n in _imported(rel, ast.parse(src)))]
    assert users and all(u.startswith("cli/") for u in users), users
