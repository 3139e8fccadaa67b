"""Find the files `port`/`check` scan and what kind each is; honor excludes and `--changed-since`."""

from __future__ import annotations

import fnmatch
import os
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tputool.codemods.gitignore import Ignores
from tputool.errors import UserError

# Directory names never descended into (hidden directories are skipped too).
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", "build", "dist",
     "site-packages", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".eggs"}
)
# Files larger than this are skipped with a TPU940 finding (generated code, data); `--max-file-size` changes it.
DEFAULT_MAX_FILE_SIZE = 1024 * 1024
# Why a listed file is not analysed (SourceFile.skip).
NOT_REGULAR, TOO_LARGE = "not a regular file", "too large"

_SHELL_SUFFIXES = (".sh", ".bash", ".zsh", ".slurm", ".sbatch")
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")


@dataclass(frozen=True)
class SourceFile:
    """One file to scan: absolute path, the path shown to the user, path relative to the project root."""

    path: str
    display: str
    rel: str  # posix, relative to the config root (used for exclude / per-file-ignores globs)
    kinds: frozenset[str]
    skip: str | None = None  # NOT_REGULAR / TOO_LARGE: listed and reported, never read
    size: int = 0
    outside: bool = False  # reached through a symlink to a file outside the scanned paths: never written

    @property
    def is_python(self) -> bool:
        """True for files that go through the Python rewriter."""
        return "python" in self.kinds


def classify(name: str, parent: str = "") -> frozenset[str]:
    """The kinds of a file from its name (and parent directory name); empty when it is not scanned.

    Kinds: python, shell, docker, make, config, deps (dependency lists), cuda, cmake.
    """
    lower = name.lower()
    if lower.endswith(".ipynb"):
        return frozenset({"python", "notebook"})
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


def _git_root(start: Path) -> Path | None:
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def _start_ignores(start: Path) -> Ignores:
    """The .gitignore files that apply at `start`: its own and its ancestors' up to the git work tree's top."""
    ignores = Ignores()
    top = _git_root(start)
    chain = [start] if top is None else [start, *start.parents[:len(start.relative_to(top).parts)]]
    for d in chain:
        ignores.load(d)
    return ignores


def discover(paths: Sequence[str], root: Path, exclude: Sequence[str] = (),
             only: Iterable[Path] | None = None, max_size: int = DEFAULT_MAX_FILE_SIZE,
             gitignore: bool = True) -> list[SourceFile]:
    """Every scannable file under `paths` (files or directories), sorted, de-duplicated by resolved path.

    `root` anchors exclude globs; `only`, when given, keeps just those absolute paths (--changed-since).
    Directory walks honour .gitignore files; files that are not regular (FIFOs, devices, sockets) or are
    bigger than `max_size` are listed with `skip` set and are never opened. A symlink to a file outside
    every scanned path is read but marked `outside` (never written through).
    Raises UserError for a path that does not exist or a named path that is not a regular file.
    """
    root = root.resolve()
    keep = None if only is None else {p.resolve() for p in only}
    found: dict[tuple[int, int], SourceFile] = {}
    starts = []
    for raw in paths:
        start = Path(raw).absolute()
        try:
            st = os.stat(start)
        except OSError:
            raise UserError(f"path does not exist: {raw}") from None
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise UserError(f"not a regular file or directory: {raw}")
        starts.append((raw, start.resolve(), stat.S_ISDIR(st.st_mode)))
    roots = [s for _, s, is_dir in starts if is_dir]

    def inside(real: Path) -> bool:
        return any(real == r or r in real.parents for r in roots)

    def add(p: Path, named: bool) -> None:
        kinds = classify(p.name, p.parent.name)
        if not kinds:
            return
        real = p.resolve()
        if keep is not None and real not in keep and p not in keep:
            return
        rel = _rel(p, root)
        if any(glob_match(rel, g) for g in exclude):
            return
        try:
            st = os.stat(p)
        except OSError:
            return  # a dangling symlink
        skip = None
        if not stat.S_ISREG(st.st_mode):
            skip = NOT_REGULAR
        elif st.st_size > max_size:
            skip = TOO_LARGE
        outside = not named and p.is_symlink() and not inside(real)
        src = SourceFile(str(p), display_path(p), rel, kinds, skip, st.st_size, outside)
        key = (st.st_dev, st.st_ino)  # a file reached twice (symlink, hard link) is read once,
        old = found.get(key)  # under its own path when that is scanned
        if old is None or (Path(old.path) != Path(old.path).resolve() and p == real):
            found[key] = src

    for _raw, start, is_dir in starts:
        if not is_dir:
            add(start, True)
            continue
        ignores = _start_ignores(start) if gitignore else None
        for dirpath, dirnames, filenames in os.walk(start):
            base = Path(dirpath)
            if ignores is not None:
                ignores.load(base)
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
                and not any(glob_match(_rel(base / d, root), g) for g in exclude)
                and not (ignores is not None and ignores.ignored(base / d, True))
            )
            for name in sorted(filenames):
                if not name.startswith(".") and not (ignores is not None and ignores.ignored(base / name, False)):
                    add(base / name, False)
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


class NotReadable(Exception):
    """A listed file turned out not to be a regular file, or to be over the size cap, when it was opened."""


def read_regular(path: str, max_size: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_size` of them.

    Opens without blocking (a FIFO swapped in since discovery does not hang) and checks the opened file
    itself, so a device or a file that grew past the cap raises NotReadable instead of being read.
    OSError propagates.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable(NOT_REGULAR)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_size + 1)
        if len(data) > max_size:
            raise NotReadable(TOO_LARGE)
        return data
    finally:
        os.close(fd)
