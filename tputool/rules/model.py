"""The data port/check and diagnose share: rules, findings, fix safety, severities and suppressions."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


class Severity(enum.IntEnum):
    """How much a finding matters; `check --fail-on` compares against it."""

    INFO = 1
    WARNING = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class FixSafety(enum.Enum):
    """Whether a rule's rewrite is applied by default (safe), only with --unsafe-fixes, or never (none)."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    NONE = "none"


class RuleClass(enum.Enum):
    """The classes of ../shared/reference/cuda-patterns.md."""

    AUTO = "AUTO"
    AUTO_NOTE = "AUTO+N"
    REVIEW = "REVIEW"
    BLOCKER = "BLOCKER"


# What a qualified name a port rule matches means (see `NameRef`): rename it, report it, or leave it to a
# call/statement handler (OWNED) or to the assignment-statement machinery (ASSIGN).
RENAME, FIND, OWNED, ASSIGN = "rename", "find", "owned", "assign"


@dataclass(frozen=True)
class NameRef:
    """What a reference to a qualified name means for its rule: a rename (target set), a finding, or owned."""

    kind: str = FIND
    target: str | None = None  # qualified replacement for the matched prefix (RENAME)
    message: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Hook:
    """A handler of a libcst node kind: `handler` is "module.function" in tputool/codemods/python/.

    Handlers of one node kind run in `order` (each may return a new node for the next); a handler shared by
    several rules is named, with the same order, by each of them.
    """

    node: str  # a libcst node class name: "Call", "Assign", "Dict", ...
    handler: str  # e.g. "device.cuda_method"
    order: int = 0


@dataclass(frozen=True)
class Port:
    """Everything `tputool port` needs to find a Python rule, from which codemods/python derives its tables.

    `triggers`: substrings one of which any code the rule fires on holds (the file pre-filter skips a file
    holding none; the cold masking hides a statement holding none); `words`: triggers that count only as a
    whole identifier inside a file; `digit_words`: identifiers that make a statement hot only beside a digit.
    `refs`: qualified-name prefixes and what a reference to them means (api.reference); `statements`: calls
    whose expression statement is removed or rewritten; `unwrap`: context managers unwrapped from `with`;
    `assigns`: assignment targets handled as whole statements; `imports`: modules whose import is a finding;
    `fallback`: a prefix reported under this rule when no `refs` entry of any rule matches.
    """

    triggers: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    digit_words: tuple[str, ...] = ()
    hooks: tuple[Hook, ...] = ()
    refs: tuple[tuple[str, NameRef], ...] = ()
    statements: tuple[str, ...] = ()
    unwrap: tuple[str, ...] = ()
    assigns: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    fallback: str | None = None
    fix_note: str | None = None  # the note shown where the statements/unwrap machinery applies the fix


@dataclass(frozen=True)
class Rule:
    """One stable rule: its code never changes meaning once published."""

    code: str  # e.g. "TPU101"
    name: str  # kebab-case, e.g. "cuda-method-call"
    message: str  # one line, shown with each finding
    severity: Severity
    fix: FixSafety
    rule_class: RuleClass
    doc: str  # several lines: what it finds, why, the fix, an example
    patterns: tuple[int, ...] = ()  # row numbers in cuda-patterns.md
    before: str | None = None  # the doc's example input (port rules), run through `port` by the tests
    after: str | None = None  # what `port` makes of `before` (None: the rule only reports)
    port: Port | None = None  # how the Python rewriter finds it (port rules only)


@dataclass(slots=True)
class Finding:
    """One place in one file where a rule fired: the one finding type of port, check, diagnose and parity.

    Port/check set `fixed`/`fixable` (whether the rewrite was applied / exists); diagnose also fills the rule's
    `name`, the concrete `fix` text, how often it was seen (`count`, `per_step`) and where it came from (`source`).
    Slotted: a port of a big generated file holds ~17 per kB of source (no per-instance dict: ~90 bytes less each).
    """

    path: str
    line: int  # 1-based
    col: int  # 1-based (0: the whole line)
    code: str
    message: str
    severity: Severity
    fixed: bool = False
    fixable: bool = False  # a fix exists (perhaps only with --unsafe-fixes)
    extra: dict = field(default_factory=dict)
    name: str = ""  # the rule's kebab-case name
    fix: str = ""  # what to do, in words (diagnose)
    count: int = 1  # times seen in a run (diagnose)
    per_step: float | None = None  # count / optimizer steps, where steps ran (diagnose)
    source: str = "static"  # "static" (check's analysis) | "runtime" (seen while the script ran)


@dataclass
class Settings:
    """What the user chose: rule selection, ignores and unsafe fixes (CLI flags merged with [tool.tputool])."""

    select: frozenset[str] | None = None  # None: all rules; else code prefixes ("TPU1", "TPU101")
    ignore: frozenset[str] = frozenset()  # code prefixes
    unsafe_fixes: bool = False

    def enabled(self, code: str) -> bool:
        """True when rule `code` is selected and not ignored."""
        if any(code.startswith(p) for p in self.ignore):
            return False
        return self.select is None or any(code.startswith(p) for p in self.select)


# `# tputool: ignore[...]` in Python; non-Python files (JSON-with-comments, CUDA) also take `// tputool: ignore[...]`.
_SUPPRESS = re.compile(r"#\s*tputool:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?")
_SUPPRESS_TEXT = re.compile(r"(?:#|//)\s*tputool:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?")


def suppressed_codes(line_text: str, *, non_python: bool = False) -> frozenset[str] | None:
    """Codes an inline `# tputool: ignore[TPU101,TPU2]` comment suppresses on this line.

    Returns None when the line has no suppression comment, and frozenset({"*"}) for a bare
    `# tputool: ignore` (suppresses every rule on the line). With `non_python` (the TPU9xx scanner's files)
    `//` comments count too and codes are upper-cased.
    """
    m = (_SUPPRESS_TEXT if non_python else _SUPPRESS).search(line_text)
    if not m:
        return None
    if not m.group(1):
        return frozenset({"*"})
    codes = (c.strip() for c in m.group(1).split(",") if c.strip())
    return frozenset(c.upper() for c in codes) if non_python else frozenset(codes)


def is_suppressed(code: str, codes: frozenset[str] | None) -> bool:
    """True when `code` is covered by what `suppressed_codes` returned (prefixes allowed)."""
    if codes is None:
        return False
    return "*" in codes or any(code.startswith(c) for c in codes)
