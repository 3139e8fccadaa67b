"""Each HTML report opened in headless Chromium (Debian's `chromium` package): it renders without console
errors, and the screenshot is a drawn page, not a blank one. Slow: three tool runs and three browser starts."""

from __future__ import annotations

import dataclasses

import pytest

from tests.reports.conftest import SCRIPTS, render_in_chromium, tputool


def _tune_page(path):
    from tests.tune.test_search import DIMS, fake_hw, synthetic_run
    from tputool.reports import tune as report
    from tputool.tune.search import tune_measured
    from tputool.tune.space import SearchSpace

    timed = synthetic_run([])
    space = SearchSpace(batches=(1, 4, 64), remats=("none", "full"), attentions=(("plain", 0),),
                        precisions=("bf16",))
    result = tune_measured(DIMS, fake_hw(hbm=40e6), space,
                           lambda c: dataclasses.replace(timed(c), temp_bytes=c.batch * 10**6, argument_bytes=10**6))
    path.write_text(report.render(result))


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["diagnose", "parity", "tune"])
def test_report_renders_in_chromium_without_console_errors(tool, tmp_path):
    page = tmp_path / f"{tool}.html"
    if tool == "tune":
        _tune_page(page)
    else:
        script = SCRIPTS / ("slow_steps.py" if tool == "diagnose" else "drift_mlp.py")
        r = tputool(tool, str(script), "--html", str(page))
        assert r.returncode == 1 and page.exists(), r.stderr
    png = tmp_path / f"{tool}.png"
    console = render_in_chromium(page, png, tmp_path)
    assert console == []
    from PIL import Image

    with Image.open(png) as im:
        colors = im.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colors is None or len(colors) > 50, "the screenshot is (nearly) blank"
