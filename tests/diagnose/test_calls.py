"""Loops without an optimizer: top-level model calls are the iterations (tputool.diagnose.calls)."""

from __future__ import annotations

import textwrap

import pytest

from tputool.diagnose import diagnose

pytestmark = pytest.mark.usefixtures("no_backend")


def test_top_level_calls_counted_once_each_nested_and_compiled_included(tmp_path):
    p = tmp_path / "infer.py"
    p.write_text(textwrap.dedent("""\
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
        compiled = torch.compile(model, backend="eager")
        with torch.no_grad():
            for n in range(5):
                model(torch.randn(2, 8))
            for n in range(3):
                compiled(torch.randn(2, 8))
        """))
    report = diagnose(str(p), include_static=False)
    assert report.status == "ok", report.error
    assert (report.loop, report.calls, report.steps) == ("calls", 8, 0)


def test_stateless_modules_are_no_model_calls(tmp_path):
    """A transform module (torchvision's are nn.Modules) or a loss called on each batch outside the model is no
    iteration: only the model's calls count."""
    p = tmp_path / "infer.py"
    p.write_text(textwrap.dedent("""\
        import torch

        class Scale(torch.nn.Module):
            def forward(self, x):
                return x * 0.5

        model, scale, loss = torch.nn.Linear(8, 8), Scale(), torch.nn.MSELoss()
        with torch.no_grad():
            for n in range(4):
                x = scale(torch.randn(2, 8))
                loss(model(x), x)
        """))
    report = diagnose(str(p), include_static=False)
    assert report.status == "ok", report.error
    assert (report.loop, report.calls, report.steps) == ("calls", 4, 0)


def test_optimizer_steps_take_over_from_calls(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent("""\
        import torch

        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for n in range(3):
            model(torch.randn(2, 8))  # an eval before training
        for n in range(4):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        """))
    report = diagnose(str(p), include_static=False)
    assert (report.loop, report.steps, report.calls) == ("steps", 4, 0)
