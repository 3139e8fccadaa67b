"""The Python rewriter's per-rule tables, derived once at import from the rule catalogue (tputool/rules/port.py).

A port rule is registered in one place, its catalogue entry: its `Port` names the trigger strings, the
qualified names it matches and the handlers (`"module.function"` in this package) it needs. From it come
the name tables of tables.py (REFS, STATEMENT_CALLS, ...), the pre-filter and cold-masking triggers
(PYTHON_TRIGGERS, speed/cold_triggers.py) and the transformer's handler chains. Anything inconsistent (a
name claimed twice, an unknown handler, two orders for one handler) raises at import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tputool.rules.model import FIND, Rule


@dataclass(frozen=True)
class Ref:
    """What a reference means: a rename (target set), a finding, or owned by a call/statement handler."""

    code: str
    kind: str = FIND
    target: str | None = None  # qualified replacement for the matched prefix (RENAME)
    message: str | None = None
    note: str | None = None


def port_rules() -> tuple[Rule, ...]:
    """The catalogue's rules that the Python rewriter can fire, in catalogue order."""
    from tputool.rules.port import RULES

    return tuple(r for r in RULES.values() if r.port is not None)


def _claim(table: dict, key: str, value, code: str, what: str) -> None:
    if key in table:
        raise ValueError(f"{code}: {what} {key!r} is already claimed by {table[key]!r}")
    table[key] = value


def refs(rules: Iterable[Rule]) -> dict[str, Ref]:
    """Qualified-name prefix -> what a reference to it means (each prefix claimed by one rule)."""
    out: dict[str, Ref] = {}
    for r in rules:
        for name, ref in r.port.refs:
            _claim(out, name, Ref(r.code, ref.kind, ref.target, ref.message, ref.note), r.code, "reference")
    return out


def code_table(rules: Iterable[Rule], field: str) -> dict[str, str]:
    """Qualified name -> rule code for one of Port's name fields (statements, unwrap, assigns, imports)."""
    out: dict[str, str] = {}
    for r in rules:
        for name in getattr(r.port, field):
            _claim(out, name, r.code, r.code, field)
    return out


def fallback(rules: Iterable[Rule]) -> tuple[str, str]:
    """(prefix, code) of the one rule reporting the names under a prefix that no `refs` entry matches."""
    found = [(r.port.fallback, r.code) for r in rules if r.port.fallback]
    if len(found) != 1:
        raise ValueError(f"exactly one port rule may name a fallback prefix, found {found}")
    return found[0]


@dataclass(frozen=True)
class Triggers:
    """The catalogue's trigger strings by kind, each once, in catalogue order."""

    plain: tuple[str, ...]  # substrings
    words: tuple[str, ...]  # whole identifiers (inside a file; substrings for the file pre-filter)
    digit_words: tuple[str, ...]  # identifiers that count beside a digit

    def prefilter(self) -> tuple[bytes, ...]:
        """The file pre-filter's byte strings: every trigger, less those holding another (they add nothing)."""
        every = list(dict.fromkeys((*self.plain, *self.words, *self.digit_words)))
        kept = [t for t in every if not any(o != t and o in t for o in every)]
        return tuple(t.encode() for t in kept)


def triggers(rules: Iterable[Rule]) -> Triggers:
    """The trigger strings of every rule (a string plain for one rule is plain for all)."""
    plain: dict[str, None] = {}
    words: dict[str, None] = {}
    digit: dict[str, None] = {}
    for r in rules:
        plain.update(dict.fromkeys(r.port.triggers))
        words.update(dict.fromkeys(r.port.words))
        digit.update(dict.fromkeys(r.port.digit_words))
    return Triggers(tuple(plain), tuple(w for w in words if w not in plain),
                    tuple(d for d in digit if d not in plain and d not in words))


def hooks(rules: Iterable[Rule]) -> dict[str, tuple[Callable, ...]]:
    """libcst node kind -> its handlers (functions of this package), resolved and in order.

    Raises ValueError on a handler that does not exist or that two rules give different orders, or when two
    handlers of one node kind share an order.
    """
    import libcst as cst

    order: dict[tuple[str, str], int] = {}
    for r in rules:
        for h in r.port.hooks:
            if not isinstance(getattr(cst, h.node, None), type):
                raise ValueError(f"{r.code}: {h.node!r} is not a libcst node kind")
            if order.setdefault((h.node, h.handler), h.order) != h.order:
                raise ValueError(f"{r.code}: handler {h.handler} of {h.node} has two orders")
    out: dict[str, list[tuple[int, Callable]]] = {}
    for (node, name), at in order.items():
        if any(o == at for o, _ in out.get(node, ())):
            raise ValueError(f"two handlers of {node} share order {at} ({name})")
        out.setdefault(node, []).append((at, resolve(name)))
    return {node: tuple(f for _, f in sorted(fs, key=lambda p: p[0])) for node, fs in out.items()}


def resolve(name: str) -> Callable:
    """The function `name` ("module.function") of tputool/codemods/python/; ValueError when there is none."""
    module, _, func = name.rpartition(".")
    try:
        target = getattr(importlib.import_module(f"tputool.codemods.python.{module}"), func)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"unknown port handler {name!r}: {exc}") from None
    if not callable(target):
        raise ValueError(f"port handler {name!r} is not a function")
    return target
