"""OpInfo sweep of the bundled `tpu` backend against CPU (forward, backward, random ops by distribution).

One test per (OpInfo, dtype); every sample of the op runs inside it. CI runs the representative slice
in `_opinfo_tables.CI_SLICE`; every other OpInfo is marked slow, so the full sweep is
`pytest -m '' tests/backend/test_opinfo.py` (add `-k float32` for one dtype; ~20 min float32 on 2 cores).
A summary grouped by cause is printed at the end and a JSON report written. Settings (environment):
  TPUTOOL_OPINFO_MAX_SAMPLES  samples per op and dtype, the first N the OpInfo yields (default 8 in the
                              CI slice, 3 in the rest of the full sweep)
  TPUTOOL_OPINFO_BUDGET_S     seconds per op and dtype before remaining samples are dropped (default 30)
  TPUTOOL_OPINFO_REPORT       JSON report path (default build/opinfo.json)
  TPUTOOL_OPINFO_DEVICE       device under test (default tpu; `cpu` checks the harness itself)
  TPUTOOL_OPINFO_EAGER_MODE   a torch.tpu.EagerMode member name to run under (default: the backend's)
"""

from __future__ import annotations

import os

import pytest
import torch

# The device must exist before OpInfo's device-type machinery is imported (autoloaded by `import torch`).
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

from tests.backend import _opinfo
from tests.backend import _opinfo_tables as T

DEVICE = os.environ.get("TPUTOOL_OPINFO_DEVICE", "tpu")
SLICE_SAMPLES, FULL_SAMPLES = 8, 3
"""Default samples per op: the full sweep of ~1500 op/dtype pairs took 20 min for float32 at 3 samples on
a shared 2-core machine (every new shape is an XLA compile), so it takes fewer than the CI slice."""
MAX_SAMPLES = int(os.environ["TPUTOOL_OPINFO_MAX_SAMPLES"]) if "TPUTOOL_OPINFO_MAX_SAMPLES" in os.environ else None
BUDGET_S = float(os.environ.get("TPUTOOL_OPINFO_BUDGET_S", "30"))


def _device_error() -> str | None:
    try:
        torch.ones(1, device=DEVICE)
    except Exception as e:  # noqa: BLE001
        return _opinfo.first_line(e)
    return None


DEVICE_ERROR = _device_error()
if DEVICE_ERROR is None and DEVICE == "tpu" and os.environ.get("TPUTOOL_OPINFO_EAGER_MODE"):
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, os.environ["TPUTOOL_OPINFO_EAGER_MODE"]))


def _params() -> list:
    params = []
    slice_set = set(T.CI_SLICE)
    for op in op_db:
        key = _opinfo.op_key(op)
        supported = op.supported_dtypes("cpu")
        for dtype in T.SWEEP_DTYPES:
            if dtype not in supported:
                continue
            in_slice = key in slice_set and (dtype == torch.float32 or key in T.CI_SLICE_EXTRA_DTYPES)
            marks = () if in_slice else (pytest.mark.slow,)
            params.append(pytest.param(op, dtype, in_slice, id=f"{key}-{str(dtype).removeprefix('torch.')}",
                                       marks=marks))
    return params


def test_device_available() -> None:
    assert DEVICE_ERROR is None, f"cannot create a tensor on {DEVICE!r}: {DEVICE_ERROR}"


def test_ci_slice_names_exist() -> None:
    keys = {_opinfo.op_key(op) for op in op_db}
    assert not set(T.CI_SLICE) - keys
    assert not (set(T.SHAPE_ONLY_OPS) | T.DISTRIBUTION_OPS | set(T.SKIP_OPS) | set(T.FIRST_OUTPUT_ONLY_OPS)
                | T.TIE_INDEX_OPS | T.NONNEGATIVE_OPS | T.INTEGRAL_OPS | T.CPU_ARGS_OPS) - keys


@pytest.mark.parametrize(("op", "dtype", "in_slice"), _params())
def test_opinfo(op, dtype: torch.dtype, in_slice: bool) -> None:
    if DEVICE_ERROR is not None:
        pytest.skip(f"no {DEVICE} device (see test_device_available): {DEVICE_ERROR}")
    samples = MAX_SAMPLES if MAX_SAMPLES is not None else (SLICE_SAMPLES if in_slice else FULL_SAMPLES)
    res = _opinfo.run_op(op, dtype, DEVICE, samples, BUDGET_S)
    if res.status == _opinfo.FAILED:
        pytest.fail(f"{res.cause} ({res.detail})", pytrace=False)
    if res.status == _opinfo.SKIPPED:
        pytest.skip(res.cause)
