"""Each port rule's documented example (the Before/After that `tputool rules CODE` prints) holds: `port` turns the
rule's `before` into its `after`."""

from __future__ import annotations

import pytest

from tputool.codemods.python import port_python
from tputool.rules.catalogue import get_rule
from tputool.rules.model import FixSafety, Settings
from tputool.rules.port import RULES

REMOVED = "(statement removed)"  # the `after` of rules that delete the statement
# Examples are one-line snippets; these imports give their names a meaning (tried in order, the first that works).
PRELUDES = (
    "",
    "import torch\n",
    "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n",
    "import torch\nfrom apex.normalization import FusedLayerNorm\n",
)
EXAMPLES = sorted(code for code, r in RULES.items() if r.after is not None)


def _complete(snippet: str) -> str:
    """The snippet as a parsable module: a block header gets a body, `except` a `try`, a decorator a function."""
    if snippet.startswith("except"):
        return f"try:\n    pass\n{snippet}\n    pass\n"
    if snippet.startswith("@"):
        return f"{snippet}\ndef f():\n    pass\n"
    return snippet + ("\n    pass\n" if snippet.rstrip().endswith(":") else "\n")


def _ported(code: str, prelude: str, alone: bool) -> str | None:
    # A safe rule's example is what the default port does; an unsafe rule's, what --unsafe-fixes does.
    settings = Settings(select=frozenset({code}) if alone else None,
                        unsafe_fixes=RULES[code].fix is not FixSafety.SAFE)
    try:
        return port_python(prelude + _complete(RULES[code].before), "example.py", settings)[0]
    except Exception:  # the snippet needs another prelude
        return None


def _matches(code: str, prelude: str, out: str | None) -> bool:
    rule = RULES[code]
    if out is None:
        return False
    if rule.after == REMOVED:
        return rule.before not in out and set(out.split()) <= set(prelude.split())
    return _complete(rule.after) in out


def test_every_port_rule_that_rewrites_has_an_example():
    assert EXAMPLES
    for code, rule in RULES.items():
        assert rule.before, code
        if rule.after is not None:
            assert f"Before:\n    {rule.before}\nAfter:\n    {rule.after}\n" in get_rule(code).doc


@pytest.mark.parametrize("code", EXAMPLES)
def test_documented_example_is_what_port_does(code):
    # The rule alone first (its own effect), then with every rule (examples showing two rules together).
    tries = [(p, alone) for p in PRELUDES for alone in (True, False)]
    outs = [(p, alone, _ported(code, p, alone)) for p, alone in tries]
    assert any(_matches(code, p, out) for p, _, out in outs), (RULES[code].before, RULES[code].after, outs[:4])
