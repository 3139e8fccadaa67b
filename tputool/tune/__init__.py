"""tputool.tune: cost model, search and tuned-config application (`apply_config`, `active_config`)."""

from tputool.tune.config import TuneConfig, active_config, apply_config, clear_config, load_config

__all__ = ["TuneConfig", "active_config", "apply_config", "clear_config", "load_config"]
