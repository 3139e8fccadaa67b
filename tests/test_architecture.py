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


_CODE = re.compile(r"TPU[0-9]{3}")
# What codemods/python derives from the catalogue (tputool/rules/port.py) rather than lists itself.
_DERIVED = {"PYTHON_TRIGGERS", "CALL_HANDLERS", "REFS", "CUDA_CATCH_ALL", "IMPORT_FINDINGS", "STATEMENT_CALLS",
            "WITH_UNWRAP", "ASSIGN_TARGETS", "WORD_TRIGGERS", "NARROWED"}


def _literal_codes(node: ast.AST) -> int:
    elts = [*node.keys, *node.values] if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return sum(isinstance(e, ast.Constant) and isinstance(e.value, str) and bool(_CODE.fullmatch(e.value))
               for e in elts)


def test_a_port_rule_is_registered_in_one_place():
    # Places a new port rule must be registered: 1, its entry in rules/port.py (metadata, doc, example, triggers,
    # matched names, handler names). The rewriter holds no table of rule codes (a dict, set, list or tuple literal
    # naming two or more codes) and no literal of what it derives from the catalogue; a handler names the one
    # code it fires where it fires it.
    tables, literal_derived = [], []
    for rel, src in _modules():
        if rel.parts[0] != "codemods":
            continue
        tree = ast.parse(src)
        tables += [f"{rel}:{n.lineno}" for n in ast.walk(tree)
                   if isinstance(n, ast.Dict | ast.Set | ast.List | ast.Tuple) and _literal_codes(n) >= 2]
        for n in tree.body:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id in _DERIVED for t in targets) and _hand_written(n.value):
                literal_derived.append(f"{rel}:{n.lineno}")
    assert not tables, f"tables of rule codes outside the catalogue: {tables}"
    assert not literal_derived, f"listed by hand, not derived from the catalogue: {literal_derived}"


def _hand_written(value: ast.AST | None) -> bool:
    """A collection literal (or frozenset/tuple/dict of one) listing two or more constants or handler references."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.args:
        value = value.args[0]
    if isinstance(value, ast.Dict):
        elts = [*value.keys, *value.values]
    elif isinstance(value, ast.Set | ast.List | ast.Tuple):
        elts = value.elts
    else:
        return False
    return sum(isinstance(e, ast.Constant | ast.Attribute) for e in elts) >= 2
