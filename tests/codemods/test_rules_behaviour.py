"""port_python behaviour across rules: alias resolution, imports, suppressions, rule selection, errors."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from tputool.codemods.python import port_python
from tputool.rules.model import Settings


def port(src: str, **kw) -> tuple[str, list]:
    return port_python(textwrap.dedent(src).lstrip("\n"), "m.py", Settings(**kw))


@pytest.mark.parametrize(("src", "want"), [
    ("import torch as th\nth.cuda.synchronize()\n", "import torch as th\nth.tpu.synchronize()\n"),
    ("from torch import cuda\nn = cuda.device_count()\n", "import torch\n\nn = torch.tpu.device_count()\n"),
    ("import torch.cuda as tc\ntc.manual_seed(0)\n", "import torch\n\ntorch.tpu.manual_seed(0)\n"),
    ("import torch\nfrom torch.cuda import synchronize\nsynchronize()\n", "import torch\ntorch.tpu.synchronize()\n"),
    ("import torch.cuda\ntorch.cuda.synchronize()\n", "import torch.cuda\ntorch.tpu.synchronize()\n"),
    ("from torch.backends import cudnn\nimport torch\ncudnn.benchmark = True\nx = 1\n", "import torch\nx = 1\n"),
    ("from torch.cuda import amp\nwith amp.autocast():\n    pass\n",
     'import torch\n\nwith torch.autocast("tpu", dtype=torch.bfloat16):\n    pass\n'),
    ("import torch.cuda.amp as amp\nwith amp.autocast(True):\n    pass\n",
     'import torch\n\nwith torch.autocast("tpu", dtype=torch.bfloat16, enabled=True):\n    pass\n'),
])
def test_aliases_resolve(src: str, want: str) -> None:
    out, findings = port(src)
    assert out == want
    assert findings and all(f.fixed for f in findings)


def test_import_kept_while_still_used() -> None:
    src = """
    from torch.cuda.amp import autocast, common
    ok = common.amp_definitely_not_available()
    with autocast():
        pass
    """
    out, findings = port(src)
    assert "from torch.cuda.amp import common\n" in out
    assert 'torch.autocast("tpu"' in out and "\nimport torch\n" in out
    assert {f.code: f.fixed for f in findings} == {"TPU219": False, "TPU301": True}


def test_local_names_are_not_torch() -> None:
    src = """
    class cuda:
        @staticmethod
        def synchronize():
            pass
    cuda.synchronize()
    def autocast():
        pass
    with autocast():
        pass
    """
    out, findings = port(src)
    assert out == textwrap.dedent(src).lstrip("\n")
    assert findings == []


def test_unchanged_source_is_the_same_object_text() -> None:
    src = "import torch\nx = torch.zeros(3)\n"
    out, findings = port_python(src, "m.py", Settings())
    assert out is src and findings == []


@pytest.mark.parametrize("comment", ["# tputool: ignore", "# tputool: ignore[TPU101]", "# tputool: ignore[TPU1]"])
def test_inline_suppression(comment: str) -> None:
    src = f"x = y.cuda()  {comment}\nz = w.cuda()\n"
    out, findings = port(src)
    assert out == f'x = y.cuda()  {comment}\nz = w.to("tpu")\n'
    assert [(f.line, f.code) for f in findings] == [(2, "TPU101")]


def test_suppression_of_other_code_does_not_apply() -> None:
    out, findings = port("x = y.cuda()  # tputool: ignore[TPU2]\n")
    assert out.startswith('x = y.to("tpu")')
    assert [f.code for f in findings] == ["TPU101"]


def test_suppression_on_first_line_of_multiline_statement() -> None:
    src = """
    x = torch.zeros(  # tputool: ignore[TPU105]
        3,
        device="cuda",
    )
    """
    out, findings = port(src)
    assert out == textwrap.dedent(src).lstrip("\n")
    assert findings == []


def test_suppressed_statement_removal_is_kept() -> None:
    src = "import torch\ntorch.backends.cudnn.benchmark = True  # tputool: ignore\n"
    out, findings = port(src)
    assert out == src and findings == []


def test_settings_select_and_ignore() -> None:
    src = "import torch\nx = y.cuda()\ntorch.cuda.synchronize()\n"
    out, findings = port(src, select=frozenset({"TPU2"}))
    assert out == "import torch\nx = y.cuda()\ntorch.tpu.synchronize()\n"
    assert [f.code for f in findings] == ["TPU201"]
    out, findings = port(src, ignore=frozenset({"TPU201"}))
    assert out == 'import torch\nx = y.to("tpu")\ntorch.cuda.synchronize()\n'
    assert [f.code for f in findings] == ["TPU101"]


def test_unsafe_rules_report_but_do_not_rewrite_by_default() -> None:
    src = "import torch\nx = y.half()\n"
    out, findings = port(src)
    assert out == src
    [f] = findings
    assert (f.code, f.fixed, f.fixable) == ("TPU306", False, True)
    out, findings = port(src, unsafe_fixes=True)
    assert out == "import torch\nx = y.bfloat16()\n"
    assert findings[0].fixed


def test_grad_scaler_moves_to_tpu_keeping_enabled_and_unsafe_disables_it() -> None:
    src = "import torch\nscaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))\n"
    out, [f] = port(src)
    assert out == "import torch\nscaler = torch.amp.GradScaler(\"tpu\", enabled=(dtype == 'float16'))\n"
    assert f.fixed
    out, _ = port(src, unsafe_fixes=True)
    assert out == 'import torch\nscaler = torch.amp.GradScaler("tpu", enabled=False)\n'


def test_auto_note_rules_carry_a_note() -> None:
    _, findings = port("x = y.cuda(args.gpu)\n")
    [f] = findings
    assert f.code == "TPU102" and f.extra["note"] and f.fixed


def test_finding_positions_are_one_based() -> None:
    _, findings = port("import torch\n\nif True:\n    x = y.cuda()\n")
    [f] = findings
    assert (f.path, f.line, f.col) == ("m.py", 4, 9)


def test_statement_removal_keeps_blocks_valid() -> None:
    src = """
    import torch
    def f():
        torch.backends.cudnn.benchmark = True
    try:
        torch.cuda.empty_cache()
    except Exception:
        torch.backends.cudnn.enabled = False
    else:
        torch.backends.cudnn.allow_tf32 = True
    while x: torch.cuda.empty_cache()
    """
    out, _ = port(src)
    cst.parse_module(out)
    assert out.count("pass") == 5 and "cudnn" not in out and "empty_cache" not in out


def test_unparsable_input_raises_parser_error() -> None:
    with pytest.raises(cst.ParserSyntaxError):
        port_python("def f(:\n    x.cuda()\n", "bad.py", Settings())


def test_torch_import_added_once_when_missing() -> None:
    out, _ = port("x = y.cuda(0)\nz = w.cuda(1)\n")
    assert out == 'import torch\n\nx = y.to(torch.device("tpu", 0))\nz = w.to(torch.device("tpu", 1))\n'


def test_no_runtime_monkeypatching() -> None:
    out, _ = port("import torch\nok = torch.cuda.is_available()\nfn = torch.cuda.is_available\n")
    assert out == "import torch\nok = torch.tpu.is_available()\nfn = torch.tpu.is_available\n"


def test_float64_is_never_downcast() -> None:
    src = "import torch\nx = torch.zeros(3, dtype=torch.float64).double().to(device)\n"
    out, findings = port(src, unsafe_fixes=True)
    assert out == src
    assert {f.code for f in findings} == {"TPU307"} and not any(f.fixed for f in findings)


def test_shadowed_import_uses_scope_analysis() -> None:
    src = """
    import torch
    from torch import cuda
    def f(cuda):
        cuda.synchronize()
    cuda.synchronize()
    """
    out, findings = port(src)
    assert "    cuda.synchronize()\n" in out and "\ntorch.tpu.synchronize()\n" in out
    assert [(f.line, f.code) for f in findings] == [(5, "TPU201")]


def test_import_index() -> None:
    from tputool.codemods.python.speed.names import build_index, resolve

    idx = build_index("import torch as th\nimport torch.nn.functional as F\nfrom torch.cuda.amp import autocast as ac\n"
                      "import os.path\n")
    assert idx.exact
    assert resolve(idx, "th.cuda.x") == "torch.cuda.x"
    assert resolve(idx, "F.relu") == "torch.nn.functional.relu"
    assert resolve(idx, "ac") == "torch.cuda.amp.autocast"
    assert resolve(idx, "os.path.join") == "os.path.join"
    assert resolve(idx, "model.cuda") is None
    assert not build_index("import torch\ntorch = 3\n").exact
    assert not build_index("from torch.cuda import *\n").exact
    assert not build_index("try:\n    import a as m\nexcept ImportError:\n    import b as m\n").exact


def test_fixtures_agree_under_scope_analysis(monkeypatch) -> None:
    """Every fixture ports the same when names are resolved by libcst scope analysis instead of the index."""
    from tests.codemods.rules_fixtures import load_fixtures
    from tputool.codemods.python.speed import names

    fixtures = load_fixtures()
    fast = [port_python(fx.source, "f.py", Settings()) for fx in fixtures]
    real = names.build_index
    monkeypatch.setattr(names, "build_index",
                        lambda s, r, tree=None: names.ImportIndex(real(s, r, tree).targets, exact=False))
    for fx, (out, findings) in zip(fixtures, fast, strict=True):
        out2, findings2 = port_python(fx.source, "f.py", Settings())
        assert out2 == out, fx.name
        assert [(f.line, f.code, f.fixed) for f in findings2] == [(f.line, f.code, f.fixed) for f in findings]


def test_shadowing_other_packages_keeps_the_fast_index() -> None:
    from tputool.codemods.python.speed.names import build_index
    from tputool.codemods.python.tables import RELEVANT_ROOTS

    src = "try:\n    import numpy as np\nexcept ImportError:\n    np = None\nimport torch\n"
    assert build_index(src, RELEVANT_ROOTS).exact
    assert not build_index(src.replace("numpy", "torch.nn"), RELEVANT_ROOTS).exact
    assert not build_index("import torch\ndef f(torch):\n    pass\n", RELEVANT_ROOTS).exact


def test_comments_inside_rewritten_calls_survive() -> None:
    out, _ = port("y = x.cuda(\n    0,  # the gpu\n    non_blocking=True,  # async\n)\n")
    assert out.endswith('y = x.to(\n    torch.device("tpu", 0),  # the gpu\n    non_blocking=True,  # async\n)\n')


def test_unused_imports_pruned_textually() -> None:
    src = ("from torch.cuda.amp import (\n    common,\n    autocast,\n)\ns = common.amp_definitely_not_available()\n"
           "with autocast():\n    pass\n")
    out, _ = port(src)
    assert out.startswith("from torch.cuda.amp import common\nimport torch\n")
    # a mention in a string keeps the import (conservative)
    out, _ = port('from torch.cuda.amp import autocast\nprint("autocast")\nwith autocast():\n    pass\n')
    assert out.startswith("from torch.cuda.amp import autocast\n")
    # a user's own unused import is never touched
    out, _ = port("from torch.cuda import amp\nimport os\nx = y.cuda()\n")
    assert out == 'from torch.cuda import amp\nimport os\nx = y.to("tpu")\n'


def test_comments_around_removed_and_unwrapped_statements_are_kept() -> None:
    src = ("import torch\n\n\ndef f():\n    # set up the step\n    torch.backends.cudnn.benchmark = True  # autotune\n"
           "    x = 1\n    # only about the flag below\n    torch.backends.cudnn.benchmark = True\n\n    y = 2\n"
           "    with torch.backends.cuda.sdp_kernel(enable_flash=False):  # math attention here\n        z = 3\n")
    out, _ = port(src)
    assert "    # set up the step\n    x = 1\n" in out  # describes what follows too: kept
    assert "only about the flag below" not in out and "# autotune" not in out  # belonged to the removed lines
    assert "    # math attention here\n    z = 3\n" in out  # a `with` header's comment stays with its body


def test_disabled_autocast_moves_its_device_and_gains_no_dtype():
    """x-transformers: `@autocast('cuda', enabled = False)` keeps a region in float32; it casts nothing, so the
    port moves its device only (it gained `dtype=torch.bfloat16`, noise a reviewer must read twice)."""
    src = "from torch.amp import autocast\n\n@autocast('cuda', enabled = False)\ndef f(x):\n    return x\n"
    out, findings = port(src)
    assert out == src.replace("'cuda'", "'tpu'") and [f.code for f in findings] == ["TPU302"]
    out, _ = port("import torch\nwith torch.autocast('cuda'):\n    pass\n")
    assert "dtype=torch.bfloat16" in out  # an enabled one still gains the TPU's dtype
