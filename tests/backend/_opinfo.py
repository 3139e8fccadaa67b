"""Machinery of the OpInfo sweep: run one OpInfo's samples on the device and on CPU, compare, record.

Samples are generated on CPU (seeded) and copied to the device, so both runs see the same values.
Each (op, dtype) gives one `OpResult`; `RESULTS` collects them for the session summary and the JSON
report written by tests/backend/conftest.py.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from tests.backend import _opinfo_tables as T

PASSED, PASSED_FALLBACK, FAILED, SKIPPED = "passed", "passed (fallback)", "failed", "skipped"


@dataclass
class OpResult:
    """Outcome of one OpInfo at one dtype."""

    op: str
    dtype: str
    status: str = PASSED
    cause: str = ""
    detail: str = ""
    samples_passed: int = 0
    samples_failed: int = 0
    samples_skipped: int = 0
    samples_total: int = 0
    backward_checked: int = 0
    fallback_calls: int = 0
    fallback_ops: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


RESULTS: list[OpResult] = []


class SampleFailure(Exception):
    """A sample whose device result differs from CPU (or that errors only on the device)."""


class SampleSkip(Exception):
    """A sample that cannot be compared, with a reason a user would accept."""


def op_key(op: Any) -> str:
    """OpInfo name plus '.variant' when it has one."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def first_line(e: BaseException) -> str:
    """`Type: first line of the message`, at most 160 characters."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:160]


def tolerances(op: Any, dtype: torch.dtype, base: dict[str, float]) -> dict[str, float]:
    """`base` raised to the largest toleranceOverride the OpInfo declares for `dtype` (any CPU/generic test)."""
    atol, rtol = base["atol"], base["rtol"]
    for info in list(op.decorators):
        if getattr(info, "device_type", None) not in (None, "cpu") or not getattr(info, "active_if", True):
            continue
        for dec in getattr(info, "decorators", []):
            tol = getattr(dec, "d", {}).get(dtype) if isinstance(getattr(dec, "d", None), dict) else None
            if hasattr(tol, "atol") and hasattr(tol, "rtol"):
                atol, rtol = max(atol, tol.atol), max(rtol, tol.rtol)
    return {"atol": atol, "rtol": rtol}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _to_device(tree: Any, device: str, memo: dict[int, torch.Tensor]) -> Any:
    """Copy every CPU tensor (keeping requires_grad, identity and aliasing of repeats) and device name."""

    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                y = x.detach().to(device)
                memo[id(x)] = y.requires_grad_(True) if x.requires_grad else y
            return memo[id(x)]
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device(device)
        if isinstance(x, str) and x == "cpu":
            return device
        return x

    return tree_map(move, tree)


def _to_cpu(tree: Any) -> Any:
    return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)


def device_dtypes(device: str) -> frozenset[torch.dtype] | None:
    """The dtypes the bundled backend can hold (None: unknown, e.g. for `cpu`)."""
    if device != "tpu":
        return None
    try:
        from tputool.backend.dtypes import TORCH_TO_NP
    except ImportError:
        return None
    return frozenset(TORCH_TO_NP)


def _check_dtypes(tree: Any, device: str) -> None:
    supported = device_dtypes(device)
    for t in _tensors(tree):
        if supported is not None and t.dtype not in supported:
            raise SampleSkip(f"{t.dtype} is not supported on tpu (tputool.backend.dtypes)")
        if t.layout != torch.strided:
            raise SampleSkip("sparse tensors are unsupported on tpu")


def _compare(actual: Any, expected: Any, tol: dict[str, float], what: str) -> None:
    try:
        torch.testing.assert_close(_to_cpu(actual), expected, equal_nan=True, check_device=False, **tol)
    except AssertionError as e:
        raise SampleFailure(f"{what} mismatch: {str(e).strip().splitlines()[0]}") from e


def _check_shapes(actual: Any, expected: Any) -> None:
    a, e = _tensors(actual), _tensors(expected)
    if len(a) != len(e):
        raise SampleFailure(f"forward mismatch: {len(a)} output tensors, expected {len(e)}")
    for x, y in zip(a, e, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            raise SampleFailure(f"forward mismatch: got {x.dtype}{list(x.shape)}, expected {y.dtype}{list(y.shape)}")


def _stats(t: torch.Tensor, robust: bool) -> tuple[float, float]:
    v = t.double().flatten()
    if robust:
        q = torch.quantile(v, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
        return q[1].item(), (q[2] - q[0]).item()
    return v.mean().item(), v.std().item()


def _check_distribution(actual: Any, expected: Any, key: str) -> None:
    """Same shape/dtype and finiteness; the op's support; for >= 100 values, close location and spread."""
    _check_shapes(actual, expected)
    robust = key in T.HEAVY_TAILED_OPS
    for x, y in zip(_tensors(_to_cpu(actual)), _tensors(expected), strict=True):
        if x.numel() == 0:
            continue
        xd, yd = x.double(), y.double()
        if not torch.isfinite(xd).all() and torch.isfinite(yd).all():
            raise SampleFailure("distribution mismatch: non-finite values where CPU has none")
        if key in T.NONNEGATIVE_OPS and not bool((xd >= 0).all()):
            raise SampleFailure("distribution mismatch: negative values from a non-negative distribution")
        if key in T.UNIT_INTERVAL_OPS and not bool((xd <= 1).all()):
            raise SampleFailure("distribution mismatch: values above 1 from a [0, 1] distribution")
        if key in T.INTEGRAL_OPS and not bool((xd == xd.round()).all()):
            raise SampleFailure("distribution mismatch: non-integer values from an integer distribution")
        n = x.numel()
        if n < 100:
            continue
        (mx, sx), (my, sy) = _stats(x, robust), _stats(y, robust)
        spread = max(sx, sy, 1e-6)
        if abs(mx - my) > 6 * spread / math.sqrt(n) + 0.05 * spread:
            raise SampleFailure(f"distribution mismatch: location {mx:.4g} vs CPU {my:.4g} (n={n})")
        if not (0.5 <= (sx + 1e-9) / (sy + 1e-9) <= 2.0):
            raise SampleFailure(f"distribution mismatch: spread {sx:.4g} vs CPU {sy:.4g} (n={n})")


def _ties_matter(key: str, sample: Any) -> bool:
    """True for an op in TIE_INDEX_OPS, not asked to be stable, on an input with repeated values."""
    if key not in T.TIE_INDEX_OPS or sample.kwargs.get("stable") is True or not isinstance(sample.input, torch.Tensor):
        return False
    flat = sample.input.detach().flatten()
    return flat.unique().numel() < flat.numel()


def _values_only(out: Any) -> Any:
    """The outputs of a (values, indices) result without the indices."""
    if isinstance(out, tuple) and hasattr(out, "values") and hasattr(out, "indices"):
        return out.values
    return out


def _random_sample(key: str, sample: Any) -> bool:
    kw = sample.kwargs
    if kw.get("training", True) is False:
        return False
    values = [kw.get(k) for k in T.RANDOM_SAMPLE_KWARGS]
    if key in T.RANDOM_SAMPLE_ARGS and len(sample.args) > T.RANDOM_SAMPLE_ARGS[key]:
        values.append(sample.args[T.RANDOM_SAMPLE_ARGS[key]])
    return any(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values)


def _call(op: Any, sample: Any) -> Any:
    return op(sample.input, *sample.args, **sample.kwargs)


def _grad_roots(sample: Any, out: Any) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """(float inputs that require grad, sum of the float outputs that require grad) or None if no path."""
    inputs = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    outs = [t for t in _tensors(sample.output_process_fn_grad(out)) if t.requires_grad and t.is_floating_point()]
    if not inputs or not outs:
        return inputs, None
    return inputs, sum(o.sum() for o in outs)


def _detached(sample: Any) -> Any:
    return sample.transform(lambda t: t.detach() if isinstance(t, torch.Tensor) else t)


def check_sample(op: Any, key: str, sample: Any, device: str, dtype: torch.dtype) -> bool:
    """Compare one sample on `device` with CPU; True if backward was compared too. Raises SampleFailure/Skip."""
    _check_dtypes((sample.input, sample.args, sample.kwargs), device)
    dev_sample = sample.transform(lambda t: t)  # a shallow copy whose tensors we then move
    memo: dict[int, torch.Tensor] = {}
    if key in T.CPU_ARGS_OPS:
        dev_sample.input = _to_device(sample.input, device, memo)
    else:
        dev_sample.input, dev_sample.args, dev_sample.kwargs = _to_device(
            (sample.input, sample.args, sample.kwargs), device, memo)
    torch.manual_seed(0)
    try:
        expected = _call(op, sample)
    except Exception as e:  # noqa: BLE001 - the reference itself refuses this sample
        if not any(t.requires_grad for t in _tensors(sample.input)):
            raise SampleSkip(f"the sample errors on CPU as well ({first_line(e)})") from e
        sample, dev_sample = _detached(sample), _detached(dev_sample)
        try:
            expected = _call(op, sample)
        except Exception as e2:  # noqa: BLE001
            raise SampleSkip(f"the sample errors on CPU as well ({first_line(e2)})") from e2
    _check_dtypes(expected, device)
    torch.manual_seed(0)
    try:
        actual = _call(op, dev_sample)
    except Exception as e:  # noqa: BLE001
        raise SampleFailure(f"forward error: {first_line(e)}") from e
    inputs_moved = bool(memo) and device != "cpu"
    for t in _tensors(actual):
        if inputs_moved and t.device.type == "cpu" and not key.startswith(("to", "cpu")):
            raise SampleFailure("forward mismatch: output tensor on cpu, expected the device")
    if key in T.SHAPE_ONLY_OPS or _random_sample(key, sample):
        _check_shapes(actual, expected)
        return False
    if key in T.DISTRIBUTION_OPS:
        _check_distribution(actual, expected, key)
        return False
    if _ties_matter(key, sample):
        if key != "argsort":
            _compare(_values_only(actual), _values_only(expected), tolerances(op, dtype, T.FORWARD_TOL), "forward")
        _check_shapes(actual, expected)
        return False
    if key in T.FIRST_OUTPUT_ONLY_OPS:
        _compare(actual[0], expected[0], tolerances(op, dtype, T.FORWARD_TOL), "forward")
    else:
        _compare(actual, expected, tolerances(op, dtype, T.FORWARD_TOL), "forward")
    dev_in = _tensors((dev_sample.input, dev_sample.args, dev_sample.kwargs))
    _compare(dev_in, _tensors((sample.input, sample.args, sample.kwargs)), T.FORWARD_TOL, "mutated input")
    if not (op.supports_autograd and dtype == torch.float32):
        return False
    cpu_inputs, cpu_loss = _grad_roots(sample, expected)
    if cpu_loss is None:
        return False
    expected_grads = torch.autograd.grad(cpu_loss, cpu_inputs, allow_unused=True)
    dev_inputs, dev_loss = _grad_roots(dev_sample, actual)
    if dev_loss is None:
        raise SampleFailure("backward mismatch: the device output does not require grad")
    try:
        actual_grads = torch.autograd.grad(dev_loss, dev_inputs, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        raise SampleFailure(f"backward error: {first_line(e)}") from e
    _compare(list(actual_grads), list(expected_grads), tolerances(op, dtype, T.BACKWARD_TOL), "backward")
    return True


def fallback_counts() -> Counter[str]:
    """CPU-fallback events so far, by op (empty when the backend has no event counter)."""
    try:
        from tputool.backend import events
    except ImportError:
        return Counter()
    return Counter({detail: n for (kind, detail), n in events.counts.items() if kind == "fallback"})


def run_op(op: Any, dtype: torch.dtype, device: str, max_samples: int | None, budget_s: float) -> OpResult:
    """Run up to `max_samples` samples of `op` (stopping after `budget_s`), record and return the result."""
    key = op_key(op)
    res = OpResult(op=key, dtype=str(dtype).removeprefix("torch."))
    start = time.perf_counter()
    before = fallback_counts()
    causes: list[str] = []
    skip_reasons: Counter[str] = Counter()
    try:
        if key in T.SKIP_OPS:
            raise SampleSkip(T.SKIP_OPS[key])
        for prefix, reason in T.SKIP_PREFIXES.items():
            if key.startswith(prefix):
                raise SampleSkip(reason)
        torch.manual_seed(0)
        needs_grad = op.supports_autograd and dtype == torch.float32 and key not in T.DISTRIBUTION_OPS
        samples = op.sample_inputs("cpu", dtype, requires_grad=needs_grad)
        for i, sample in enumerate(samples):
            if (max_samples is not None and i >= max_samples) or time.perf_counter() - start > budget_s:
                break
            res.samples_total += 1
            try:
                res.backward_checked += check_sample(op, key, sample, device, dtype)
                res.samples_passed += 1
            except SampleSkip as e:
                res.samples_skipped += 1
                skip_reasons[str(e)] += 1
            except SampleFailure as e:
                res.samples_failed += 1
                causes.append(str(e))
            except Exception as e:  # noqa: BLE001 - a crash in the comparison itself counts as a failure
                res.samples_failed += 1
                causes.append(f"harness error: {first_line(e)}")
    except SampleSkip as e:
        skip_reasons[str(e)] += 1
    after = fallback_counts()
    res.fallback_ops = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    res.fallback_calls = sum(res.fallback_ops.values())
    res.seconds = round(time.perf_counter() - start, 3)
    if causes:
        res.status, res.cause = FAILED, causes[0]
        res.detail = f"{len(causes)}/{res.samples_total} samples failed; distinct causes: {sorted(set(causes))[:5]}"
    elif res.samples_passed == 0:
        res.status = SKIPPED
        res.cause = skip_reasons.most_common(1)[0][0] if skip_reasons else "the OpInfo has no sample inputs"
    elif res.fallback_calls:
        res.status = PASSED_FALLBACK
    if skip_reasons and res.status != SKIPPED:
        res.detail = (res.detail + "; " if res.detail else "") + f"skipped samples: {dict(skip_reasons)}"
    RESULTS.append(res)
    return res


def summary_lines(results: list[OpResult]) -> list[str]:
    """The human summary: totals, then failures grouped by cause, most common first."""
    by_status = Counter(r.status for r in results)
    lines = [
        f"OpInfo sweep: {by_status[PASSED]} passed, {by_status[PASSED_FALLBACK]} passed (fallback), "
        f"{by_status[FAILED]} failed, {by_status[SKIPPED]} skipped  ({len(results)} op/dtype pairs)"
    ]
    for dtype in sorted({r.dtype for r in results}):
        sub = [r for r in results if r.dtype == dtype]
        c = Counter(r.status for r in sub)
        ran = len(sub) - c[SKIPPED]
        pct = 100.0 * c[PASSED] / ran if ran else 0.0
        lines.append(f"  {dtype}: {c[PASSED]}/{ran} pass on the device ({pct:.1f}%), "
                     f"{c[PASSED_FALLBACK]} only via CPU fallback, {c[FAILED]} failed, {c[SKIPPED]} skipped")
    groups: dict[str, list[str]] = {}
    for r in results:
        if r.status == FAILED:
            groups.setdefault(r.cause, []).append(f"{r.op}[{r.dtype}]")
    if groups:
        lines.append("failures by cause:")
        for cause, ops in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(ops[:12]) + (f", ... (+{len(ops) - 12})" if len(ops) > 12 else "")
            lines.append(f"  {len(ops):4d}  {cause}\n        {shown}")
    skips = Counter(r.cause for r in results if r.status == SKIPPED)
    if skips:
        lines.append("skips by reason:")
        lines += [f"  {n:4d}  {reason}" for reason, n in skips.most_common()]
    return lines


def write_report(results: list[OpResult], path: Path, meta: dict[str, Any]) -> None:
    """Write every result plus `meta` (device, eager mode, sample limit, wall time) as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1))
