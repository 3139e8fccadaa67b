"""The autoload entry point: import order and the off switch, each in a fresh interpreter."""

import subprocess
import sys

import pytest


def _run(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("first", ["import torch", "import tputool.backend; import torch"])
def test_device_registers_cleanly_in_either_import_order(first):
    res = _run(f"{first}\nprint(torch.ones(2, device='tpu').add(1).cpu().tolist())")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[2.0, 2.0]"


def test_backend_off_switch():
    res = _run("import torch\nprint(hasattr(torch, 'tpu'))", TPUTOOL_BACKEND="0")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


@pytest.mark.parametrize(("imp", "env", "frozen"), [
    ("import torch", {}, True),
    ("import torch", {"TPUTOOL_GC_FREEZE": "0"}, False),
    ("import tputool.backend", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, True),  # torch imported by it
    ("import torch; import tputool.backend", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, False),  # late: user objects
])
def test_autoload_moves_startup_objects_out_of_the_collector(imp, env, frozen):
    code = (f"import gc\n{imp}\nimport torch\nassert torch.ones(1, device='tpu').device.type == 'tpu'\n"
            "n = gc.get_freeze_count()\nimport weakref\nclass C: pass\n"
            "c = C(); c.me = c; r = weakref.ref(c); del c; gc.collect()\n"  # new cycles are still collected
            "print(n > 100000, r() is None)")
    res = _run(code, **env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(frozen), "True"]
