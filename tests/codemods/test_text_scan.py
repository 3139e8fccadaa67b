"""TPU9xx scanners over shell scripts, configs, dependency lists and CUDA sources."""

from __future__ import annotations

import pytest

from tests.codemods.helpers import invoke, write
from tputool.codemods.discover import classify
from tputool.codemods.text_scan import scan_text
from tputool.rules.model import Settings
from tputool.rules.text import TEXT_PATTERNS, TEXT_RULES


def codes(text: str, *kinds: str, settings: Settings | None = None) -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in scan_text(text, "f", frozenset(kinds), settings or Settings())]


@pytest.mark.parametrize("line,code", [
    ("export CUDA_VISIBLE_DEVICES=0,1", "TPU901"),
    ("NCCL_DEBUG=INFO python train.py", "TPU902"),
    ("export TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "TPU902"),
    ("CUDA_LAUNCH_BLOCKING=1 python x.py", "TPU903"),
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "TPU904"),
    ("python train.py --device cuda:0", "TPU910"),
    ("python train.py --device=cuda", "TPU910"),
    ("python train.py trainer.accelerator=gpu", "TPU910"),
    ("torchrun train.py --dist-backend nccl", "TPU911"),
    ("python train.py --ddp_backend=nccl", "TPU911"),
    ("python train.py --fp16", "TPU912"),
    ("accelerate launch --mixed_precision fp16 train.py", "TPU912"),
    ("torchrun --nproc_per_node=gpu train.py", "TPU913"),
    ("docker run --gpus all img", "TPU913"),
    ("#SBATCH --gres=gpu:8", "TPU913"),
    ("NGPU=$(nvidia-smi -L | wc -l)", "TPU914"),
    ("pip install flash-attn --no-build-isolation", "TPU921"),
    ("pip install -U bitsandbytes==0.43", "TPU920"),
    ("pip install torch --index-url https://download.pytorch.org/whl/cu121", "TPU928"),
])
def test_shell_lines(line, code):
    assert codes(line + "\n", "shell") == [(1, code)]


@pytest.mark.parametrize("line", [
    "python train.py --fp16 False",
    "python train.py --device cpu",
    "python train.py --dist-backend gloo",
    "# export CUDA_VISIBLE_DEVICES=0",
    "echo using bf16",
    "torchrun --nproc_per_node=8 train.py",
    "pip install flash-attention-helper-docs",
])
def test_shell_lines_that_do_not_fire(line):
    assert codes(line + "\n", "shell") == []


@pytest.mark.parametrize("text,expected", [
    ("device: cuda\n", [(1, "TPU910")]),
    ("trainer:\n  accelerator: gpu\n  precision: 16-mixed\n", [(2, "TPU910"), (3, "TPU912")]),
    ("fp16: true\nbf16: false\n", [(1, "TPU912")]),
    ("mixed_precision: 'fp16'\n", [(1, "TPU912")]),
    ("dist_backend: nccl\n", [(1, "TPU911")]),
    ("fp16:\n  enabled: true\n  loss_scale: 0\n", [(1, "TPU912")]),
    ("fp16:\n  enabled: false\nbf16:\n  enabled: true\n", []),
    ('{\n  "fp16": {\n    "enabled": true\n  },\n  "device": "cuda:0"\n}\n', [(2, "TPU912"), (5, "TPU910")]),
    ('{"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"}}\n', [(1, "TPU912")]),
    ('{"bf16": {"enabled": true}, "fp16": {"enabled": false}}\n', []),
    ('device = "cuda"\n', [(1, "TPU910")]),
    ("env:\n  - name: CUDA_VISIBLE_DEVICES\n", [(2, "TPU901")]),
    ("resources:\n  limits:\n    nvidia.com/gpu: 8\n", [(3, "TPU913")]),
])
def test_config_files(text, expected):
    assert codes(text, "config") == expected


@pytest.mark.parametrize("text,expected", [
    ("torch>=2.1\nbitsandbytes>=0.41\nflash_attn==2.5.8\nnumpy\n", [(2, "TPU920"), (3, "TPU921")]),
    ("xformers\napex\ndeepspeed[autotuning]>=0.14\ntriton\ncupy-cuda12x\npynvml\n",
     [(1, "TPU922"), (2, "TPU923"), (3, "TPU924"), (4, "TPU925"), (5, "TPU926"), (6, "TPU927")]),
    ("torch==2.3.0+cu121\nnvidia-cudnn-cu12==8.9.2.26\njax[cuda12]\n", [(1, "TPU928"), (2, "TPU928"), (3, "TPU928")]),
    ("pytorch-triton\nflash-attn-docs-theme\nnumpy  # bitsandbytes later\n", []),
    ('dependencies = [\n  "torch>=2.1",\n  "flash-attn>=2",\n]\n', [(3, "TPU921")]),
    ("dependencies:\n  - python=3.11\n  - pip:\n    - deepspeed==0.14\n", [(4, "TPU924")]),
    ('description = "works without bitsandbytes"\n', []),
])
def test_dependency_lists(text, expected):
    assert codes(text, "deps") == expected


def test_setup_py_requirements():
    text = ('from torch.utils.cpp_extension import CUDAExtension\nsetup(install_requires=["xformers"],\n'
            '      ext_modules=[CUDAExtension("k", ["k.cu"])])\n')
    assert codes(text, "deps") == [(2, "TPU922")]


def test_cuda_sources_and_cmake():
    assert codes("#include <cuda_runtime.h>\n__global__ void k() {}\n", "cuda") == [(2, "TPU930")]
    assert codes("// header only\n", "cuda") == [(1, "TPU930")]
    assert codes("project(x LANGUAGES CXX CUDA)\nfind_package(CUDAToolkit)\n", "cmake") == \
        [(1, "TPU931"), (2, "TPU931")]


def test_dockerfile_base_image():
    found = scan_text("FROM nvidia/cuda:12.1.0-runtime-ubuntu22.04\nENV NCCL_DEBUG=WARN\n", "Dockerfile",
                      frozenset({"shell", "docker"}), Settings())
    assert [(f.line, f.code) for f in found] == [(1, "TPU915"), (2, "TPU902")]
    assert "nvidia/cuda:12.1.0-runtime-ubuntu22.04" in found[0].message


def test_inline_suppressions():
    text = ("export CUDA_VISIBLE_DEVICES=0  # tputool: ignore[TPU901]\n"
            "export CUDA_VISIBLE_DEVICES=0 NCCL_DEBUG=1  # tputool: ignore[TPU902]\n"
            "export NCCL_DEBUG=1  # tputool: ignore\n"
            "export NCCL_DEBUG=1  # tputool: ignore[TPU9]\n")
    assert codes(text, "shell") == [(2, "TPU901")]
    assert codes("__global__ void k() {}  // tputool: ignore[TPU930]\n", "cuda") == []


def test_select_and_ignore_apply_to_text_rules():
    text = "export CUDA_VISIBLE_DEVICES=0 NCCL_DEBUG=1\n"
    assert codes(text, "shell", settings=Settings(ignore=frozenset({"TPU901"}))) == [(1, "TPU902")]
    assert codes(text, "shell", settings=Settings(select=frozenset({"TPU901"}))) == [(1, "TPU901")]


def test_every_pattern_has_a_documented_rule():
    for p in TEXT_PATTERNS:
        rule = TEXT_RULES[p.code]
        assert rule.doc and rule.message and rule.name
    assert all(c.startswith("TPU9") for c in TEXT_RULES)


@pytest.mark.parametrize("name,parent,kinds", [
    ("train.py", "", {"python"}),
    ("setup.py", "", {"python", "deps"}),
    ("launch.sh", "", {"shell"}),
    ("Dockerfile", "", {"shell", "docker"}),
    ("Makefile", "", {"shell", "make"}),
    ("requirements-dev.txt", "", {"deps"}),
    ("base.txt", "requirements", {"deps"}),
    ("notes.txt", "", set()),
    ("pyproject.toml", "", {"config", "deps"}),
    ("environment.yml", "", {"config", "deps"}),
    ("ds_config.json", "", {"config"}),
    ("kernel.cuh", "", {"cuda"}),
    ("CMakeLists.txt", "", {"cmake"}),
    ("image.png", "", set()),
])
def test_classify(name, parent, kinds):
    assert classify(name, parent) == frozenset(kinds)


def test_non_python_files_through_the_cli(tmp_path):
    write(tmp_path, "launch.sh", "export CUDA_VISIBLE_DEVICES=0  # tputool: ignore[TPU901]\nexport NCCL_DEBUG=1\n")
    write(tmp_path, "csrc/k.cu", "__global__ void k() {}\n")
    write(tmp_path, "notes.txt", "CUDA_VISIBLE_DEVICES\n")
    res = invoke("check", ".", "--fail-on", "info", cwd=tmp_path)
    assert res.exit_code == 1
    lines = [ln for ln in res.stdout.splitlines() if ": TPU" in ln]
    assert lines == ["csrc/k.cu:1:1: TPU930 CUDA C++ source (1 __global__ kernel(s)): no TPU path; port to "
                     "torch ops or Pallas", "launch.sh:2:8: TPU902 NCCL_DEBUG tunes NCCL; no effect on TPU"]
    port = invoke("port", "--write", ".", cwd=tmp_path)
    assert port.exit_code == 0 and (tmp_path / "launch.sh").read_text().startswith("export CUDA_VISIBLE")
