"""`[tool.tputool]` configuration: find it (nearest pyproject.toml or --config), validate it, merge CLI flags."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tputool.codemods.discover import DEFAULT_MAX_FILE_SIZE, glob_match
from tputool.errors import UserError
from tputool.rules.model import Settings, Severity

_KEYS = ("select", "ignore", "per-file-ignores", "exclude", "unsafe-fixes", "fail-on", "max-file-size")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)i?b?\s*$", re.IGNORECASE)
_CODE_PREFIX = re.compile(r"^TPU\d{0,3}$")


@dataclass
class ProjectConfig:
    """The merged settings of one run; `root` anchors the exclude and per-file-ignores globs."""

    root: Path
    source: Path | None = None  # the file the settings came from, None when there was none
    select: frozenset[str] | None = None
    ignore: frozenset[str] = frozenset()
    per_file_ignores: dict[str, frozenset[str]] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    fail_on: Severity | None = None
    max_file_size: int = DEFAULT_MAX_FILE_SIZE

    def settings_for(self, rel: str) -> Settings:
        """The rule settings for one file: global select/ignore plus matching per-file ignores."""
        extra = [codes for pat, codes in self.per_file_ignores.items() if glob_match(rel, pat)]
        ignore = self.ignore.union(*extra) if extra else self.ignore
        return Settings(select=self.select, ignore=frozenset(ignore), unsafe_fixes=self.unsafe_fixes)


def parse_severity(value: str, where: str) -> Severity:
    """'error'|'warning'|'info' -> Severity; anything else is a UserError naming `where`."""
    try:
        return Severity[str(value).strip().upper()]
    except KeyError:
        raise UserError(f"{where}: fail-on must be error, warning or info, not {value!r}") from None


def parse_size(value: object, where: str) -> int:
    """A file size: bytes as an integer, or a string like "500K", "2MB", "1.5M" (powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise UserError(f"{where}: max-file-size must be a positive size like 1048576, 500K or 2MB, not {value!r}")
    return int(float(m.group(1)) * 1024 ** " KMG".index(m.group(2).upper() or " "))


def check_codes(values: Iterable[str], known: Iterable[str], where: str) -> frozenset[str]:
    """Validate rule code prefixes ("TPU1", "TPU101"): well formed and matching at least one rule."""
    known = tuple(known)
    out = set()
    for v in values:
        if not isinstance(v, str):
            raise UserError(f"{where}: rule codes must be strings, got {v!r}")
        code = v.strip().upper()
        if not _CODE_PREFIX.match(code) or not any(k.startswith(code) for k in known):
            raise UserError(f"{where}: unknown rule code or prefix {v!r} (see `tputool rules`)")
        out.add(code)
    return frozenset(out)


def _common_dir(paths: Sequence[str]) -> Path:
    dirs = []
    for p in paths:
        ap = Path(p).absolute()
        dirs.append(ap if ap.is_dir() else ap.parent)
    if not dirs:
        return Path.cwd()
    try:
        return Path(os.path.commonpath([str(d) for d in dirs]))
    except ValueError:
        return Path.cwd()


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: invalid TOML: {str(e).splitlines()[0] if str(e) else e}") from None
    except OSError as e:
        raise UserError(f"cannot read config {path}: {e.strerror}") from None


def find_config(paths: Sequence[str]) -> Path | None:
    """The nearest pyproject.toml with a [tool.tputool] table, from the scanned paths' common directory up."""
    here = _common_dir(paths).resolve()
    for d in (here, *here.parents):
        cand = d / "pyproject.toml"
        if cand.is_file():
            data = _read_toml(cand)  # a broken pyproject.toml is an error, never silently skipped
            tool = data.get("tool", {})
            if isinstance(tool, dict) and "tputool" in tool:
                return cand
    return None


def load_config(paths: Sequence[str], config_file: str | None, known_codes: Iterable[str]) -> ProjectConfig:
    """Read and validate the configuration for a run over `paths` (explicit `config_file` wins)."""
    known = tuple(known_codes)
    if config_file is not None:
        src = Path(config_file)
        if not src.is_file():
            raise UserError(f"config file does not exist: {config_file}")
        data = _read_toml(src)
        table = data.get("tool", {}).get("tputool", data if "tool" not in data else {})
    else:
        found = find_config(paths)
        if found is None:
            return ProjectConfig(root=Path.cwd().resolve())
        src = found
        table = _read_toml(src).get("tool", {}).get("tputool", {})
    src = src.resolve()
    where = f"{src} [tool.tputool]"
    if not isinstance(table, dict):
        raise UserError(f"{where}: expected a table")
    table = {k.replace("_", "-"): v for k, v in table.items()}
    for k in table:
        if k not in _KEYS:
            raise UserError(f"{where}: unknown key {k!r} (known: {', '.join(_KEYS)})")

    def str_list(key: str) -> list[str]:
        v = table.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise UserError(f"{where}: {key} must be a list of strings")
        return v

    cfg = ProjectConfig(root=src.parent, source=src)
    if "select" in table:
        cfg.select = check_codes(str_list("select"), known, f"{where} select")
    cfg.ignore = check_codes(str_list("ignore"), known, f"{where} ignore")
    cfg.exclude = tuple(str_list("exclude"))
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise UserError(f"{where}: per-file-ignores must be a table of glob = [codes]")
    for pat, codes in pfi.items():
        if not isinstance(codes, list):
            raise UserError(f"{where}: per-file-ignores[{pat!r}] must be a list of rule codes")
        cfg.per_file_ignores[pat] = check_codes(codes, known, f"{where} per-file-ignores")
    if "unsafe-fixes" in table:
        if not isinstance(table["unsafe-fixes"], bool):
            raise UserError(f"{where}: unsafe-fixes must be true or false")
        cfg.unsafe_fixes = table["unsafe-fixes"]
    if "fail-on" in table:
        cfg.fail_on = parse_severity(table["fail-on"], where)
    if "max-file-size" in table:
        cfg.max_file_size = parse_size(table["max-file-size"], where)
    return cfg
