"""A port rule is registered in one place, its catalogue entry (tputool/rules/port.py): the Python rewriter derives
its trigger bytes, name tables and handler chains from the entries (tputool/codemods/python/registry.py)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tputool.codemods.python import (
    _MASK_TRIGGERS,
    PYTHON_TRIGGERS,
    amp,
    api,
    device,
    dist,
    perf,
    registry,
    transformer,
)
from tputool.rules.model import RENAME, FixSafety, Hook, Port
from tputool.rules.port import RULES

ROOT = Path(__file__).resolve().parents[2]

# A toy rule added to the catalogue, and nothing else: a rename through `refs`, a call handler through `hooks`
# (the handler function put, for the test, on a handler module), a trigger no other rule has.
_TOY = """
    import sys
    import libcst as cst
    from tputool.rules import port
    from tputool.rules.model import Hook, NameRef, Port, RENAME
    port.RULES["TPU799"] = port._rule(
        "TPU799", "toy-rule", port.W, port.SAFE, port.AUTO, (), "toy: use the tpu spelling", "A toy rule.",
        "x = torch.toyfoo(toybar(1))", "x = torch.tpu.toyfoo(toybaz(1))",
        port=Port(triggers=("toyfoo", "toybar"), refs=(("torch.toyfoo", NameRef(RENAME, "torch.tpu.toyfoo")),),
                  hooks=(Hook("Call", "device.toy_call", 205),)))
    from tputool.codemods.python import device

    def toy_call(t, orig, upd, q):
        if isinstance(upd.func, cst.Name) and upd.func.value == "toybar" and t.fire("TPU799", orig):
            return upd.with_changes(func=cst.Name("toybaz"))
        return upd

    device.toy_call = toy_call
    from tputool.cli import main
    sys.argv = ["tputool", "port", *sys.argv[1:]]
    main()
"""


def _port_cli(path: Path, toy: bool) -> subprocess.CompletedProcess:
    code = textwrap.dedent(_TOY) if toy else "import sys\nfrom tputool.cli import main\nsys.argv[0] = 'tputool'\n" \
        "sys.argv.insert(1, 'port')\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, str(path), "--no-progress"], capture_output=True, text=True,
                          cwd=path.parent, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_a_toy_rule_registered_only_in_the_catalogue_fires(tmp_path):
    src = tmp_path / "toy.py"
    src.write_text("import torch\n\nx = torch.toyfoo(toybar(1))\n")
    plain = _port_cli(src, toy=False)
    assert plain.returncode == 0, plain.stderr
    assert "TPU799" not in plain.stdout and re.search(r"skipped by pre-filter +1", plain.stdout)  # no trigger of any rule
    toy = _port_cli(src, toy=True)
    assert toy.returncode == 0, toy.stderr
    assert "+x = torch.tpu.toyfoo(toybaz(1))" in toy.stdout, toy.stdout
    assert toy.stdout.count("TPU799 [fixed]") == 2, toy.stdout


def test_every_python_rule_has_a_port_entry_and_every_fix_a_fixer():
    for code, rule in RULES.items():
        assert rule.port is not None, code
        p = rule.port
        assert p.triggers or p.words or p.digit_words, f"{code}: no trigger, the pre-filter would skip its files"
        fixers = p.hooks or any(ref.kind == RENAME for _, ref in p.refs) or p.statements or p.unwrap or p.assigns
        # TPU213's fix (set_default_tensor_type(torch.cuda.HalfTensor)) is the statement machinery's (api._statement).
        if rule.fix is not FixSafety.NONE and code != "TPU213":
            assert fixers, f"{code} has a fix but no handler, rename, statement, with or assignment entry"


def _handler_functions():
    """Public functions of the handler modules with a handler's signature (t, orig, upd[, q])."""
    for mod in (amp, api, device, dist, perf):
        for name, fn in vars(mod).items():
            if inspect.isfunction(fn) and fn.__module__ == mod.__name__ and not name.startswith("_"):
                params = list(inspect.signature(fn).parameters)
                if params[:1] == ["t"] and len(params) in (3, 4) and params[2] == "upd":
                    yield f"{mod.__name__.rsplit('.', 1)[1]}.{name}", fn


def test_every_handler_resolves_and_is_reachable_from_a_rule():
    named = {h.handler for r in RULES.values() for h in r.port.hooks}
    for name in named:
        assert callable(registry.resolve(name))
    machinery = {"api.reference", "api.owned_elsewhere", "api.with_unwrap"}  # driven by the rules' name tables
    unreachable = {name for name, _ in _handler_functions()} - named - machinery
    assert not unreachable, f"handlers no rule names: {sorted(unreachable)}"
    chained = {f for fs in registry.hooks(RULES.values()).values() for f in fs}
    assert {fn for name, fn in _handler_functions() if name in named} <= chained


def test_call_handlers_come_in_the_catalogues_order():
    names = [f"{f.__module__.rsplit('.', 1)[1]}.{f.__name__}" for f in transformer.CALL_HANDLERS]
    assert names[0] == "api.owned_elsewhere" and names[-1] == "api.bf16_supported"
    orders = {h.handler: h.order for r in RULES.values() for h in r.port.hooks if h.node == "Call"}
    assert [orders[n] for n in names[1:]] == sorted(orders.values())


@pytest.mark.parametrize("bad, match", [
    (Hook("Call", "device.no_such_handler", 7), "unknown port handler"),
    (Hook("Call", "nosuchmodule.f", 7), "unknown port handler"),
    (Hook("NoSuchNode", "device.to_call", 7), "not a libcst node kind"),
    (Hook("Call", "device.to_call", 31), "two orders"),
    (Hook("Call", "device.availability_test", 30), "share order"),
])
def test_a_bad_hook_fails_loudly(bad, match):
    rule = RULES["TPU101"]
    broken = rule.__class__(**{**rule.__dict__, "port": Port(triggers=("cuda",), hooks=(bad,))})
    with pytest.raises(ValueError, match=match):
        registry.hooks([*RULES.values(), broken])


def test_a_name_claimed_by_two_rules_fails_loudly():
    rule = RULES["TPU210"]
    twice = rule.__class__(**{**rule.__dict__, "code": "TPU798"})
    with pytest.raises(ValueError, match="already claimed"):
        registry.refs([rule, twice])
    with pytest.raises(ValueError, match="already claimed"):
        registry.code_table([rule, twice], "statements")


# Examples whose names come from an import (the import is part of what makes the file hot).
_EXAMPLE_IMPORTS = {"TPU502": "from torch.utils.cpp_extension import load\n", "TPU504": "from apex import amp\n",
                    "TPU505": "from apex.normalization import FusedLayerNorm\n",
                    "TPU506": "from apex.optimizers import FusedAdam\n", "TPU508": "import xformers.ops as xops\n"}


@pytest.mark.parametrize("code", sorted(RULES))
def test_a_rules_own_triggers_cover_its_example(code):
    # Each rule's triggers alone would let its documented example through the file pre-filter.
    prefilter = registry.triggers([RULES[code]]).prefilter()
    data = (_EXAMPLE_IMPORTS.get(code, "") + RULES[code].before).encode()
    assert any(t in data for t in prefilter), (code, prefilter)


def test_the_prefilter_covers_every_trigger_with_fewer_strings():
    every = {t for r in RULES.values() for t in (*r.port.triggers, *r.port.words, *r.port.digit_words)}
    kept = {t.decode() for t in PYTHON_TRIGGERS}
    assert kept <= every and all(any(k in t for k in kept) for t in every)
    assert PYTHON_TRIGGERS[0] == b"cuda"  # the commonest first: the pre-filter's any() stops early
    assert set(_MASK_TRIGGERS.words) == {w for r in RULES.values() for w in r.port.words}
    assert set(_MASK_TRIGGERS.digit_words) == {w for r in RULES.values() for w in r.port.digit_words}
