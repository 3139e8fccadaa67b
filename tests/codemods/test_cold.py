"""Hiding cold statements (cold.py) never changes what `port` produces; the pieces it relies on hold."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import libcst as cst
import pytest

from tests.codemods.rules_fixtures import load_fixtures
from tputool.codemods.python import _MASK_TRIGGERS, _port, port_python
from tputool.codemods.python.context import _scan_imports
from tputool.codemods.python.speed.cold import MARKER, mask, split_lines
from tputool.codemods.python.speed.names import build_index, top_imports
from tputool.codemods.python.tables import RELEVANT_ROOTS
from tputool.rules.model import Settings

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = '''

import torch as _t


def _step(model, batch, local_rank):
    model = model.cuda()
    with _t.cuda.amp.autocast():
        loss = model(batch.to("cuda")).sum()
    return loss.item(), _t.device("cuda", local_rank)
'''
TRICKY = [
    # try/except/else: the planner visits the bodies out of line order
    "import torch\ntry:\n    a = 1\n    b = 2\nexcept ImportError:\n    c = 3\nelse:\n    x.cuda()\n    d = 4\n",
    # elif chains are walked, never hidden; else-if is an ordinary statement
    "import torch\nif a:\n    b = 1\nelif c:\n    d = 2\nelse:\n    if e:\n        f = 3\n    g.cuda()\n",
    # one-line bodies and semicolons stay with their statement
    "import torch\nif a: b = 1\nc = 2; d.cuda()\ne = 3; f = 4\nclass K: pass\n",
    # a rewrite that moves a hidden statement (unwrapping a with) falls back to the whole file
    "import torch\nwith torch.autograd.profiler.emit_nvtx():\n    step()\n    more()\n",
    # decorators, comments between hidden siblings, CRLF, no final newline
    "import torch\r\n@dec\r\ndef f():\r\n    return 1\r\n# note\r\n\r\ndef g():\r\n    pass\r\nx = y.cuda()",
    # a name imported from a trigger-holding target is a trigger itself
    "from torch.cuda import synchronize as sync\n\ndef f():\n    sync()\n\ndef g():\n    return 2\n",
    # rewrites that need the whole module: adding `import torch`, pruning an import left unused
    "def f(x):\n    return x.to('cuda')\n\ndef g():\n    return 1\n",
    "import torch\nfrom torch.cuda.amp import autocast\n\ndef f():\n    pass\n\nwith autocast():\n    y = 1\n",
    # dimension names count only next to a digit
    "import torch\nhidden_size = 100\nconfig.hidden_size = hidden_size\nd = {'head_dim': 96}\nhead_dim = n\n",
    # every name a rule's table holds is a trigger (CUBLAS_WORKSPACE_CONFIG holds neither CUDA nor NCCL)
    "import os\nimport torch\nos.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'\n\ndef f():\n    return 1\n",
    # word triggers: items/sorted are not item/sort
    # a name imported twice: with no torch meaning it does not matter; with one, which import wins depends on the use
    "import torch\nfrom typing import Any\n\ndef f(x: Any):\n    return x.cuda()\n\nfrom collections.abc import Any\ny = torch.zeros(2).cuda()\n",
    "from numpy import device\n\ndef f():\n    return device('cuda')\n\nfrom torch import device\nx = device('cuda')\n",
    "import torch\nfor k, v in d.items():\n    print(sorted(v))\nfor x in xs:\n    y = x.item()\n",
]

# Files whose names need scope analysis (the import index is inexact): ported a window at a time, each window's
# scope analysis is given the other windows' module-level bindings (speed/scopes.py).
SCOPED = [
    # a torch name rebound later: module-level uses see the bindings before them, functions see all of them
    "from torch import device\nx = device('cuda')\n\ndef f():\n    return device('cuda')\n\n"
    "device = 'cpu'\ny = device('cuda')\nz = torch.zeros(1).cuda()\n",
    # `global` in a function rebinds the module's torch
    "import torch\n\ndef setup():\n    global torch\n    import torch_xla as torch\n\ndef g(m):\n    return m.cuda()\n\n"
    "torch.cuda.synchronize()\n",
    # a class body binds the name; its methods do not see it
    "from torch import device\n\nclass K:\n    device = 'x'\n\n    def m(self):\n        return device('cuda')\n\n"
    "    d = device\n\nw = device('cuda')\n",
    # torch = None when the import fails
    "try:\n    import torch\nexcept ImportError:\n    torch = None\n\ndef f(x):\n    return x.cuda()\n\n"
    "if torch is not None:\n    torch.cuda.manual_seed(0)\n",
    # a name imported from torch in one branch, from elsewhere in the other, shadowed in a function
    "import torch\nif a:\n    from torch.cuda.amp import autocast\nelse:\n    from contextlib import nullcontext as autocast\n\n"
    "def f(autocast):\n    return autocast\n\nwith autocast():\n    y = torch.ones(1).cuda()\n",
    # a comprehension reads the global before it is rebound
    "from torch import device\ndevs = [device('cuda', i) for i in range(2)]\n\ndef f(device):\n    return device\n\n"
    "device = None\n",
    # del, rebinding, nonlocal
    "import torch\nfrom torch import cuda\n\ndef f():\n    cuda = 1\n\n    def g():\n        nonlocal cuda\n"
    "        cuda = 2\n    return cuda\n\ndel cuda\ncuda = 1\ntorch.cuda.synchronize()\n",
    # file facts: a CUDA default tensor type set in one window and restored in another, a device name assigned last
    "import torch\n\ndef f(x):\n    return x.to(dev) if dev == 'cuda' else x\n\n"
    "torch.set_default_tensor_type(torch.cuda.HalfTensor)\n\ndef h(torch):\n    return torch\n\n"
    "torch.set_default_tensor_type(torch.FloatTensor)\n\ndev = torch.device('cuda')\n",
]
# ... and cases where a rewrite leaves an import unused: pruning it reads the whole module (those fall back)
SCOPED_PRUNING = [
    # a star import
    "import torch\nfrom torch import *\nfrom torch.cuda import synchronize\n\ndef f():\n    synchronize()\n\ndev = cuda\n"
    "x = torch.zeros(1).cuda()\n",
    # dotted imports and aliases in other windows, shadowed by a parameter
    "import torch.cuda as tc\nimport torch.cuda\n\ndef f(torch):\n    return torch.cuda.is_available()\n\n"
    "tc.synchronize()\ntorch.cuda.synchronize()\n",
    # set_default_tensor_type reached through a name imported in another window, rebound elsewhere
    "import torch\nfrom torch import set_default_tensor_type as sdt\n\ndef h(sdt):\n    return sdt\n\n"
    "sdt(torch.cuda.HalfTensor)\n\ndef g(x):\n    return x.to('cuda')\n\nsdt(torch.FloatTensor)\n",
]
SHADOW = "\n\ndef _shadow(torch):\n    return torch\n"  # makes any file's index inexact


def _whole(source: str, settings: Settings, path: str = "f.py"):
    return _port(source, path, settings, build_index(source, RELEVANT_ROOTS), None, whole=True)


def _torch_sample(n: int) -> list[str]:
    spec = importlib.util.find_spec("torch")
    root = Path(spec.origin).parent
    paths = sorted(p for sub in ("nn/modules", "optim", "amp", "cuda") for p in (root / sub).glob("*.py"))
    return [p.read_text(encoding="utf-8") for p in paths[:n]]


SOURCES = TRICKY + SCOPED + SCOPED_PRUNING + [fx.source for fx in load_fixtures()]


@pytest.mark.parametrize("unsafe", [False, True])
@pytest.mark.parametrize("source", SOURCES + [s + SNIPPET for s in _torch_sample(40)])
def test_hiding_cold_statements_changes_nothing(source: str, unsafe: bool) -> None:
    settings = Settings(unsafe_fixes=unsafe)
    assert port_python(source, "f.py", settings) == _whole(source, settings)


@pytest.mark.parametrize("source", SOURCES + _torch_sample(40))
def test_imports_from_ast_match_imports_from_libcst(source: str) -> None:
    assert top_imports(ast.parse(source), split_lines(source)) == _scan_imports(cst.parse_module(source))


def test_masked_text_keeps_hot_lines_and_maps_lines_back() -> None:
    src = "import torch\n\ndef f():\n    a = 1\n    b = 2\n\n\ndef g():\n    return x.cuda()\n"
    m = mask(src, ast.parse(src), _MASK_TRIGGERS)
    assert m is not None
    # imports are read from the ast, so they hide with their cold neighbours
    assert m.text == "__portcold0__\n\n\ndef g():\n    return x.cuda()\n"
    assert [m.line(n) for n in (1, 2, 4, 5)] == [1, 6, 8, 9]
    assert m.unmask(m.text) == src
    assert m.unmask(m.text.replace("__portcold0__", "    __portcold0__")) is None  # moved: refuse
    assert m.unmask(m.text.replace("__portcold0__\n", "")) is None  # lost: refuse


def test_findings_keep_original_line_numbers() -> None:
    src = "import torch\n\ndef f():\n    a = 1\n    b = 2\n    c = 3\n\nx = y.cuda()\n"
    _, findings = port_python(src, "f.py", Settings())
    assert [f.line for f in findings] == [8]


def test_source_holding_the_marker_is_not_masked() -> None:
    src = f"import torch\n{MARKER}0__ = 1\n\ndef f():\n    pass\nx.cuda()\n"
    assert mask(src, ast.parse(src), _MASK_TRIGGERS) is None
    assert port_python(src, "f.py", Settings()) == _whole(src, Settings())


def test_sample_repo_output_is_unchanged_by_masking() -> None:
    for path in sorted((ROOT / "fixtures" / "sample_repo").rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        assert port_python(src, path.name, Settings()) == _whole(src, Settings(), path.name), path


# ---- large files, a window at a time (WINDOW_CHARS, WINDOW_SIZE): tiny windows put every module-level statement in its own ----

@pytest.fixture
def tiny_windows(monkeypatch):
    """Port every file a module-level statement at a time; returns the list of windowed results."""
    import tputool.codemods.python as engine

    done: list = []
    real = engine._port_windows

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        done.append(result is not None)
        return result

    monkeypatch.setattr(engine, "WINDOW_CHARS", 1)
    monkeypatch.setattr(engine, "WINDOW_SIZE", 1)
    monkeypatch.setattr(engine, "_port_windows", spy)
    return done


@pytest.mark.parametrize("unsafe", [False, True])
@pytest.mark.parametrize("source", SOURCES + [s + SNIPPET for s in _torch_sample(40)]
                         + [s + SNIPPET + SHADOW for s in _torch_sample(40)])
def test_porting_in_windows_changes_nothing(source: str, unsafe: bool, tiny_windows) -> None:
    settings = Settings(unsafe_fixes=unsafe)
    assert port_python(source, "f.py", settings) == _whole(source, settings)


def test_facts_of_the_whole_file_reach_every_window(tiny_windows) -> None:
    # the device name is assigned at the end, the pair's set in another window, the TPU603 size twice
    src = ("import torch\n\ndef f(x):\n    return x.to(dev) if dev == 'cuda' else x\n\n"
           "torch.set_default_tensor_type(torch.cuda.HalfTensor)\n\nhidden_size = 96\n\n"
           "torch.set_default_tensor_type(torch.FloatTensor)\n\nhead_dim = 96\n\ndev = torch.device('cuda')\n")
    assert port_python(src, "f.py", Settings()) == _whole(src, Settings())
    assert tiny_windows == [True]
    new, findings = port_python(src, "f.py", Settings())
    assert 'torch.set_default_device("cpu")' in new and "dev == 'tpu'" in new
    assert [f.line for f in findings if f.code == "TPU603"] == [8]


def test_a_window_needing_the_whole_file_falls_back(tiny_windows) -> None:
    # the rewrite leaves `autocast`'s import unused: pruning it reads the whole module
    src = "import torch\nfrom torch.cuda.amp import autocast\n\ndef f():\n    pass\n\nwith autocast():\n    y = 1\n"
    assert port_python(src, "f.py", Settings()) == _whole(src, Settings())
    assert tiny_windows == [False]


def test_a_name_imported_twice_without_a_torch_meaning_still_ports_in_windows(tiny_windows) -> None:
    src = ("import torch\nfrom typing import Any\n\ndef f(x: Any):\n    return x.cuda()\n\n"
           "from collections.abc import Any\ny = torch.zeros(2).cuda()\n")
    assert port_python(src, "f.py", Settings()) == _whole(src, Settings())
    assert tiny_windows[-1] is True
    src = src.replace("from collections.abc import Any", "from torch import Any")  # a torch meaning: scope analysis
    assert port_python(src, "f.py", Settings()) == _whole(src, Settings())
    assert tiny_windows[-1] is True


@pytest.mark.parametrize(("source", "windowed"), [(s, True) for s in SCOPED] + [(s, False) for s in SCOPED_PRUNING])
def test_files_needing_scope_analysis_port_in_windows(source: str, windowed: bool, tiny_windows) -> None:
    assert not build_index(source, RELEVANT_ROOTS).exact
    new, findings = port_python(source, "f.py", Settings())
    assert (new, findings) == _whole(source, Settings())
    assert tiny_windows == [windowed]
    assert findings  # every case holds something to report


def test_scope_analysis_in_windows_sees_later_bindings(tiny_windows) -> None:
    # `device` is rebound after its use in f: the whole file's scope analysis gives f's `device` two meanings, one a
    # torch import; the window holding f sees both only through the bindings passed in
    src = "from torch import device\n\ndef f():\n    return device('cuda')\n\ndevice = 'cpu'\n"
    new, findings = port_python(src, "f.py", Settings())
    assert (new, findings) == _whole(src, Settings()) and tiny_windows == [True]
    assert "device('tpu')" in new or 'device("tpu")' in new


@pytest.mark.parametrize("brk", [" ", "\u2028", "\x85", "\x1c", "\v"])
def test_file_text_facts_in_windows_with_any_line_break(brk: str, tiny_windows) -> None:
    # whether the file stores float32 buffers is read from its lines (str.splitlines) joined by "\n": a line break
    # Python does not know (here in a comment) separates `register_buffer(` from `float32` as "\n" does; the
    # windows read it from the file's own text, joined again only where it breaks lines otherwise
    # (windows.float32_buffers)
    src = ("import torch\n\ndef schedule(n):\n    return torch.linspace(0, 1, n, dtype=torch.float64)\n\n"
           "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           f"        self.register_buffer('b', schedule(4))  # then{brk}float32\n\nm = M().cuda()\n")
    whole = _whole(src, Settings())
    assert port_python(src, "f.py", Settings()) == whole
    assert tiny_windows == [True]
    assert ("TPU307" in {f.code for f in whole[1]}) == (brk != " ")  # float64 kept: not stored as float32
