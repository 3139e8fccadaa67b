"""`tputool-tune.yaml`: the winner of a search as one typed record (`TuneConfig`), written and read through
its `to_dict`/`from_dict` (pyyaml does the YAML), and made the active config.

`apply_config(path)` parses and validates the file and makes it the process's active tuning config
(also exported as TPUTOOL_TUNE_CONFIG for child processes); the backend's sharding code reads it with
`active_config()` and asks it for the mesh and each parameter's partition spec (the rules are
`tputool.partition`'s, the sharding API's vocabulary: no translation). Its attention choice (plain, chunked,
or a Pallas flash/splash kernel with its block) is what compiled graphs' SDPA runs from then on, and its MoE
dispatch (dense, or grouped matmuls: ragged / the megablox kernel) what tputool's MoE layers run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tputool.errors import UserError
from tputool.partition import BATCH_AXES, LOGICAL_TO_MESH, logical_axes, partition_specs
from tputool.tune.candidate import Candidate

FORMAT_VERSION = 1
ENV_VAR = "TPUTOOL_TUNE_CONFIG"


@dataclass(frozen=True)
class TuneConfig:
    """A tuned configuration (the candidate and its partition rules) and what the search said about it.

    Only the candidate and the rules configure a run; the other fields (model, mode, ..., search) are the
    search's report, written to the file and read back when present (a hand-written file may omit them).
    """

    candidate: Candidate
    logical_to_mesh: dict[str, str | None] = field(default_factory=lambda: dict(LOGICAL_TO_MESH))
    batch_axes: tuple[str, ...] = BATCH_AXES
    source: str = ""  # the file it was read from (not written)
    model: str = ""
    mode: str = ""  # measured | predicted
    label: str = ""
    hardware: dict[str, Any] | None = None  # name, devices, kind
    predicted: dict[str, Any] | None = None  # the cost model's estimate of the winner
    measured: dict[str, Any] | None = None  # what running it showed (measured mode)
    compiled_memory_bytes_per_device: float | None = None  # from a TPU compile (predicted mode)
    search: dict[str, Any] | None = None  # candidates, run, budget, Spearman, rejected

    @property
    def mesh_shape(self) -> dict[str, int]:
        """Mesh axis -> size."""
        return self.candidate.mesh

    def param_spec(self, name: str, shape: tuple[int, ...]) -> tuple[str | None, ...]:
        """PartitionSpec entries for one parameter under the config's rules (divisibility checked)."""
        return partition_specs({name: tuple(shape)}, self.mesh_shape, self.logical_to_mesh).specs[name]

    def make_mesh(self, devices: list | None = None):
        """A `jax.sharding.Mesh` with axes (data, fsdp, tensor) over the first devices (under `diagnose --target`:
        the slice's compile-only devices)."""
        import jax

        from tputool.backend.runtime import STATE
        from tputool.tune.step import make_mesh

        if devices is None:
            devices = STATE.abstract.devices if STATE.abstract is not None else jax.devices()
        if len(devices) < self.candidate.n_devices:
            raise UserError(f"the tuned mesh needs {self.candidate.n_devices} devices, this process has "
                            f"{len(devices)} (simulate them with `tputool run --cpu-devices "
                            f"{self.candidate.n_devices}`)")
        return make_mesh(self.candidate, devices)

    def shard_model(self, model, devices: list | None = None):
        """Place a `tpu` model's parameters by the config (graph backend `shard_params`); returns (mesh, specs).
        For the active config, compiled graphs' attention kernel and sparse MoE layers then run per device of
        this mesh."""
        from tputool.backend import runtime
        from tputool.backend.graph.sharding import shard_params

        mesh = self.make_mesh(devices)
        if runtime.STATE.sdpa_kernel is not None and self is _ACTIVE:  # its Pallas kernel runs per device
            runtime.STATE.sdpa_kernel = (*runtime.STATE.sdpa_kernel[:2], mesh)
        if self is _ACTIVE:
            runtime.STATE.moe_mesh = mesh
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        return mesh, shard_params(model, mesh, partition_specs(shapes, self.mesh_shape, self.logical_to_mesh).specs)

    def remat_policy(self):
        """The `jax.checkpoint` policy of the config's remat setting (None: no remat)."""
        import jax

        if self.candidate.remat not in ("none", "save-dots", "full"):
            raise UserError(f"remat '{self.candidate.remat}' is a plan for a TPU slice (predicted mode); "
                            "the measured step runs none, save-dots or full")
        return {"none": None, "save-dots": jax.checkpoint_policies.dots_saveable,
                "full": jax.checkpoint_policies.nothing_saveable}[self.candidate.remat]

    def to_dict(self) -> dict[str, Any]:
        """The tputool-tune.yaml document (plain data; keys in file order, report sections only when set)."""
        c = self.candidate
        doc: dict[str, Any] = {"tputool_tune": FORMAT_VERSION, "model": self.model, "mode": self.mode,
                               "label": self.label}
        if self.hardware is not None:
            doc["hardware"] = self.hardware
        doc.update({
            "mesh": c.mesh, "batch_per_shard": c.batch, "global_batch": c.global_batch, "remat": c.remat,
            "attention": {"impl": c.attention, "block": c.block}, "precision": c.precision,
            **({"moe_dispatch": c.moe} if c.moe else {}),
            "partition_rules": {"logical_to_mesh": dict(self.logical_to_mesh), "batch_axes": list(self.batch_axes)},
        })
        for key in ("predicted", "measured", "compiled_memory_bytes_per_device", "search"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str = "") -> TuneConfig:
        """Parse a tputool-tune.yaml document; KeyError/TypeError/ValueError on a bad or missing field."""
        mesh = doc["mesh"]
        attn = doc.get("attention") or {}
        cand = Candidate(data=int(mesh["data"]), fsdp=int(mesh["fsdp"]), tensor=int(mesh["tensor"]),
                         batch=int(doc["batch_per_shard"]), remat=str(doc["remat"]),
                         attention=str(attn.get("impl", "plain")), block=int(attn.get("block", 0)),
                         precision=str(doc["precision"]), moe=str(doc.get("moe_dispatch") or ""))
        rules = doc.get("partition_rules") or {}
        return cls(cand, dict(rules.get("logical_to_mesh") or LOGICAL_TO_MESH),
                   tuple(rules.get("batch_axes") or BATCH_AXES), source, model=str(doc.get("model", "")),
                   mode=str(doc.get("mode", "")), label=str(doc.get("label", "")), hardware=doc.get("hardware"),
                   predicted=doc.get("predicted"), measured=doc.get("measured"),
                   compiled_memory_bytes_per_device=doc.get("compiled_memory_bytes_per_device"),
                   search=doc.get("search"))

    @classmethod
    def from_result(cls, result, row) -> TuneConfig:
        """The config of `row` (the winner or another row) of a `TuneResult`, with the search's report."""
        c: Candidate = row.candidate
        e = row.estimate
        measured = None
        if row.measurement is not None:
            m = row.measurement
            measured = {"step_s": m.step_s, "tokens_per_s": row.measured_tokens_per_s,
                        "compute_s": m.compute_s, "collective_s": m.collective_s, "compile_s": m.compile_s}
            if m.hlo_flops:
                # XLA counts a while/scan body once (chunked attention's lax.map): a cross-check, not the truth
                measured["hlo_flops_over_model_hfu"] = m.hlo_flops * e.n_devices / e.hfu_flops
        return cls(
            c, model=result.model, mode=result.mode, label=result.label,
            hardware={"name": result.hardware.name, "devices": result.hardware.n_devices,
                      "kind": result.hardware.kind},
            predicted={"step_s": e.step_s, "step_bounds_s": [e.step_lower_s, e.step_upper_s],
                       "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "memory_bytes_per_device": e.memory.total,
                       "compute_s": e.compute_s, "hbm_s": e.hbm_s, "comm_s": e.comm_s},
            measured=measured, compiled_memory_bytes_per_device=row.compiled_memory,
            search={"candidates": len(result.rows), "run": len(result.measured), "budget": result.budget,
                    "spearman_pred_vs_measured": result.spearman(),
                    "rejected": [{"what": r.candidate.key, "stage": r.status, "reason": r.reason}
                                 for r in result.rows if r.status in ("memory", "failed")]
                    + [{"what": r.what, "stage": r.stage, "reason": r.reason} for r in result.rejected]},
        )


def write_config(result, path: str | Path, row=None) -> Path:
    """Write the winner (or `row`) of `result` to `path` as YAML; returns the path."""
    import yaml

    row = row or result.winner
    if row is None:
        raise UserError("no candidate ran successfully: nothing to write")
    p = Path(path)
    p.write_text(yaml.safe_dump(TuneConfig.from_result(result, row).to_dict(), sort_keys=False))
    return p


def load_config(path: str | Path) -> TuneConfig:
    """Parse and validate a tputool-tune.yaml; a bad file is a UserError."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"tune config not found: {path}")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(doc, dict) or doc.get("tputool_tune") != FORMAT_VERSION:
        raise UserError(f"{path} is not a tputool-tune.yaml (version {FORMAT_VERSION})")
    try:
        return TuneConfig.from_dict(doc, str(p))
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: bad or missing field ({e})") from e


_ACTIVE: TuneConfig | None = None


def _set_active(cfg: TuneConfig | None) -> TuneConfig | None:
    """Make `cfg` active: its attention choice becomes the SDPA implementation of graphs compiled from now on
    (`torch.compile(backend="tpu")`, `runtime.STATE.sdpa_kernel`), its MoE dispatch that of tputool's MoE
    layers (`runtime.STATE.moe_dispatch`)."""
    global _ACTIVE
    from tputool.backend import runtime

    _ACTIVE = cfg
    c = cfg.candidate if cfg is not None else None
    runtime.STATE.sdpa_kernel = None if c is None or c.attention == "plain" else (c.attention, c.block, None)
    runtime.STATE.moe_dispatch = (c.moe or None) if c is not None else None
    runtime.STATE.moe_mesh = None  # (until its shard_model makes one)
    return cfg


def apply_config(path: str | Path) -> TuneConfig:
    """Load `path` and make it the active tuning config of this process (and of its children)."""
    cfg = _set_active(load_config(path))
    os.environ[ENV_VAR] = str(Path(path).resolve())
    return cfg


def active_config() -> TuneConfig | None:
    """The config set by apply_config (or by TPUTOOL_TUNE_CONFIG in the environment), else None."""
    if _ACTIVE is None and os.environ.get(ENV_VAR):
        _set_active(load_config(os.environ[ENV_VAR]))
    return _ACTIVE


def clear_config() -> None:
    """Forget the active config (tests, or a script that wants defaults back)."""
    _set_active(None)
    os.environ.pop(ENV_VAR, None)


__all__ = ["TuneConfig", "active_config", "apply_config", "clear_config", "load_config", "logical_axes",
           "write_config"]
