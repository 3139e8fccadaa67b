"""Find the files `port`/`check` scan and what kind each is; honor excludes and `--changed-since`."""

from __future__ import annotations

import fnmatch
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tputool.errors import UserError

# Directory names never descended into (hidden directories are skipped too).
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", "build", "dist",
     "site-packages", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".eggs"}
)
# Non-Python text files larger than this are data, not configuration: not scanned.
MAX_TEXT_BYTES = 2 * 1024 * 1024

_SHELL_SUFFIXES = (".sh", ".bash", ".zsh", ".slurm", ".sbatch")
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")


@dataclass(frozen=True)
class SourceFile:
    """One file to scan: absolute path, the path shown to the user, path relative to the project root."""

    path: str
    display: str
    rel: str  # posix, relative to the config root (used for exclude / per-file-ignores globs)
    kinds: frozenset[str]

    @property
    def is_python(self) -> bool:
        """True for files that go through the Python rewriter."""
        return "python" in self.kinds


def classify(name: str, parent: str = "") -> frozenset[str]:
    """The kinds of a file from its name (and parent directory name); empty when it is not scanned.

    Kinds: python, shell, docker, make, config, deps (dependency lists), cuda, cmake.
    """
    lower = name.lower()
    if name == "setup.py":
        return frozenset({"python", "deps"})
    if lower.endswith(".py"):
        return frozenset({"python"})
    if lower.endswith((".cu", ".cuh")):
        return frozenset({"cuda"})
    if lower.endswith(_SHELL_SUFFIXES):
        return frozenset({"shell"})
    if lower in ("dockerfile", "containerfile") or lower.startswith("dockerfile.") or lower.endswith(".dockerfile"):
        return frozenset({"shell", "docker"})
    if lower in ("makefile", "gnumakefile") or lower.endswith(".mk"):
        return frozenset({"shell", "make"})
    if lower == "cmakelists.txt" or lower.endswith(".cmake"):
        return frozenset({"cmake"})
    if lower.endswith((".txt", ".in")) and (
        "requirements" in lower or lower.startswith("constraints") or parent.lower() == "requirements"
    ):
        return frozenset({"deps"})
    if lower == "pipfile":
        return frozenset({"deps"})
    if lower in ("pyproject.toml", "setup.cfg") or (
        lower.endswith((".yml", ".yaml")) and (lower.startswith("environment") or lower.startswith("conda"))
    ):
        return frozenset({"config", "deps"})
    if lower.endswith(_CONFIG_SUFFIXES):
        return frozenset({"config"})
    return frozenset()


def glob_match(rel: str, pattern: str) -> bool:
    """True when posix path `rel` matches `pattern`: the whole path, its file name, or a parent directory."""
    pattern = pattern.strip().rstrip("/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(PurePosixPath(rel).name, pattern):
        return True
    parts = PurePosixPath(rel).parts
    for i in range(1, len(parts)):
        if fnmatch.fnmatchcase("/".join(parts[:i]), pattern) or fnmatch.fnmatchcase(parts[i - 1], pattern):
            return True
    return False


def display_path(path: Path) -> str:
    """The path as shown to users: relative to the current directory when below it, else absolute."""
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def discover(paths: Sequence[str], root: Path, exclude: Sequence[str] = (),
             only: Iterable[Path] | None = None) -> list[SourceFile]:
    """Every scannable file under `paths` (files or directories), sorted, de-duplicated.

    `root` anchors exclude globs; `only`, when given, keeps just those absolute paths (--changed-since).
    Raises UserError for a path that does not exist.
    """
    root = root.resolve()
    keep = None if only is None else {p.resolve() for p in only}
    found: dict[str, SourceFile] = {}

    def add(p: Path) -> None:
        rel = _rel(p, root)
        if keep is not None and p not in keep:
            return
        if any(glob_match(rel, g) for g in exclude):
            return
        kinds = classify(p.name, p.parent.name)
        if not kinds:
            return
        if "python" not in kinds:
            try:
                if p.stat().st_size > MAX_TEXT_BYTES:
                    return
            except OSError:
                return
        found.setdefault(str(p), SourceFile(str(p), display_path(p), rel, kinds))

    for raw in paths:
        start = Path(raw).absolute()
        if not start.exists():
            raise UserError(f"path does not exist: {raw}")
        start = start.resolve()
        if start.is_file():
            add(start)
            continue
        for dirpath, dirnames, filenames in os.walk(start):
            base = Path(dirpath)
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
                and not any(glob_match(_rel(base / d, root), g) for g in exclude)
            )
            for name in sorted(filenames):
                if not name.startswith("."):
                    add(base / name)
    return sorted(found.values(), key=lambda f: f.display)


def _git(args: list[str], cwd: Path) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise UserError("--changed-since needs git, which was not found on PATH") from None
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, args, proc.stdout, proc.stderr)
    return proc.stdout


def changed_files(ref: str, near: Path) -> set[Path]:
    """Files changed since git `ref` (merge base with HEAD, through the working tree) plus untracked files.

    Raises UserError when `near` is not inside a git work tree or `ref` is not a commit.
    """
    near = near.resolve()
    cwd = near if near.is_dir() else near.parent
    try:
        top = Path(_git(["rev-parse", "--show-toplevel"], cwd).strip())
    except subprocess.CalledProcessError:
        raise UserError(f"--changed-since: {cwd} is not inside a git repository") from None
    try:
        _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], top)
    except subprocess.CalledProcessError:
        raise UserError(f"--changed-since: unknown git ref {ref!r}") from None
    try:
        base = _git(["merge-base", ref, "HEAD"], top).strip() or ref
    except subprocess.CalledProcessError:
        base = ref
    diff = _git(["diff", "--name-only", "--diff-filter=d", "-z", base, "--"], top)
    untracked = _git(["ls-files", "--others", "--exclude-standard", "-z"], top)
    names = [n for n in (diff + untracked).split("\0") if n]
    return {(top / n).resolve() for n in names}
