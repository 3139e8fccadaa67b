"""`tune_model`: resolve a model, describe it, and run a measured or predicted search; `profile_model`: trace
one configuration's training step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tputool.errors import UserError
from tputool.models.spec import ModelSpec
from tputool.profile.reader import TraceSummary
from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.search import Row, TuneResult, tune_measured, tune_predicted
from tputool.tune.space import SearchSpace
from tputool.tune.xla_log import XlaLog


@dataclass
class ResolvedModel:
    """A model ready for tuning: its spec, config, analytic description and parameter shapes."""

    spec: ModelSpec
    config: Any
    dims: ModelDims
    param_shapes: dict[str, tuple[int, ...]]


def resolve_model(model: str, overrides: dict[str, Any] | None = None) -> ResolvedModel:
    """`llama` or `path/to/file.py:build_fn`, with config `overrides` for built-ins."""
    import torch

    from tputool.models import load_model_spec
    from tputool.tune.model_dims import model_dims

    spec = load_model_spec(model)
    config = spec.config(**(overrides or {}))
    with torch.device("meta"):  # shapes only: an 8B model must not be materialised to be described
        module = spec.build(config)
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    return ResolvedModel(spec, config, model_dims(spec.name, module, config), shapes)


def measured_runner(rm: ResolvedModel, steps: int = 3, log: XlaLog | None = None) -> Callable[[Candidate], Any]:
    """A function that builds, compiles and profiles one candidate on the devices at hand (XLA's compile
    warnings filed in `log`)."""
    from tputool.tune.measure import measure
    from tputool.tune.step import build_step

    def run(c: Candidate):
        return measure(build_step(rm.spec, rm.config, c), rm.spec, rm.config, steps=steps, log=log, who=c.key)

    return run


def profile_model(model: str, steps: int, outdir: str | Path, candidate: Candidate | None = None,
                  overrides: dict[str, Any] | None = None) -> TraceSummary:
    """Trace `steps` training steps of `model` (data-parallel over all devices unless `candidate` is given)."""
    import jax

    from tputool.profile.capture import capture
    from tputool.tune.measure import warm_step
    from tputool.tune.step import build_step

    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    rm = resolve_model(model, overrides)
    c = candidate or Candidate(data=jax.device_count(), batch=1)
    one, _, _ = warm_step(build_step(rm.spec, rm.config, c), rm.spec, rm.config)
    return capture(one, steps, outdir)


def tune_model(model: str, *, target: str | None = None, overrides: dict[str, Any] | None = None,
               space: SearchSpace | None = None, fraction: float = 1 / 3, hbm_bytes: float | None = None,
               steps: int = 3, compile_top: int = 3,
               progress: Callable[[Row, int, int], None] | None = None,
               calibration: str | None = None, top: int | None = None) -> TuneResult:
    """Search `model`'s configurations: measured on the local devices (at most `fraction` of the candidates
    and at most `top` are run), or predicted for a TPU `target` (achievable fractions from the `calibration`
    YAML, default the fit on published runs; with libtpu the `compile_top` best are compiled for it, 0: none)."""
    rm = resolve_model(model, overrides)
    log = XlaLog()
    result = _search(rm, log, target=target, space=space or SearchSpace(), fraction=fraction, hbm_bytes=hbm_bytes,
                     steps=steps, compile_top=compile_top, progress=progress, calibration=calibration, top=top)
    result.notes.extend(log.summary())
    return result


def _search(rm: ResolvedModel, log: XlaLog, *, target: str | None, space: SearchSpace, fraction: float,
            hbm_bytes: float | None, steps: int, compile_top: int,
            progress: Callable[[Row, int, int], None] | None, calibration: str | None,
            top: int | None = None) -> TuneResult:
    """The measured or predicted search of `tune_model` (compile warnings filed in `log`)."""
    if not 0 < fraction <= 1:
        raise UserError(f"--fraction must be in (0, 1], got {fraction}")
    if compile_top < 0:
        raise UserError(f"--compile-top must be 0 or more, got {compile_top}")
    if target is not None:
        from tputool.tune import tpu_compile
        from tputool.tune.hardware import tpu_hardware

        hw = tpu_hardware(target, calibration=calibration)
        multi_slice = hw.slice is not None and hw.slice.slices > 1  # compile-only devices are one slice
        checked = tpu_compile.available() and not multi_slice and compile_top > 0
        check = tpu_compile.compile_checker(rm, hw, log) if checked else None
        result = tune_predicted(rm.dims, hw, space, rm.param_shapes, check, top=compile_top, progress=progress)
        if multi_slice:
            result.notes.append("multi-slice target: memory fit and times are estimated (no compile check)")
        elif compile_top == 0:
            result.notes.append("--compile-top 0: memory fit and times are estimated from the spec table (no "
                                "compile check)")
        elif check is None:
            result.notes.append("libtpu not installed (pip install 'tputool[tpu-compile]'): memory fit and "
                                "times are estimated from the spec table")
        return result
    import jax

    from tputool.tune.calibrate import calibrate_host

    devices = jax.devices()
    platform = devices[0].platform
    if platform == "tpu":
        from tputool.tune.hardware import tpu_hardware_for_devices

        hw = tpu_hardware_for_devices(devices)
        label = f"TPU measurements on {len(devices)} x {devices[0].device_kind}"
    elif platform == "cpu":
        hw = calibrate_host(devices, memory_bytes=hbm_bytes * len(devices) if hbm_bytes else None)
        label = f"CPU measurements on {len(devices)} {'simulated ' if len(devices) > 1 else ''}CPU devices " \
                "(they validate, not rank, TPU strategies)"
    else:
        raise UserError(f"measured mode runs on TPU or CPU devices, found {platform}; use --target to predict")
    return tune_measured(rm.dims, hw, space, measured_runner(rm, steps, log), fraction, rm.param_shapes,
                         progress, label, top=top)
