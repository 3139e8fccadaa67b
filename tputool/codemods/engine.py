"""The port/check engine: read files, pre-filter, run the Python rewriter and text scanners over all cores.

`run()` is the one entry point behind `tputool port` and `tputool check` (and benchmarks/port_speed.py):
it never writes; `writer.apply()` writes what it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import multiprocessing
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from tputool.codemods import notebook
from tputool.codemods.config import ProjectConfig
from tputool.codemods.discover import TOO_LARGE, NotReadable, SourceFile, discover, read_regular
from tputool.codemods.linediff import unified_diff
from tputool.codemods.text_scan import scan_text
from tputool.codemods.textio import check_encodable, decode_python, decode_text
from tputool.rules.model import Finding, Settings
from tputool.rules.text import TEXT_RULES

# Below this many bytes of Python that must go through the rewriter, a process pool costs more than it
# saves. Measured on the 2-core dev box: a fork pool of 2 starts and stops in 10-17 ms, while
# port_python handles ~5-20 KB/s (metadata-resolving rules, ~70 ms for a 1.5 KB module), so on a machine
# with a spare core two small files already pay for it. (With every core busy, a pool of 2 was 5-50%
# slower than in-process for 2-8 small files: there is no spare core to win.)
POOL_MIN_BYTES = 4 * 1024
# Files per task sent to a worker (bounded so the progress bar moves and the load stays balanced).
MAX_CHUNK = 16

UNCHANGED, CHANGED, PREFILTERED, UNPARSABLE, ERROR = "unchanged", "changed", "prefiltered", "unparsable", "error"
SKIPPED = "skipped"  # listed but never read: not a regular file, or over the size cap (FileResult.skip says which)


@dataclass
class FileResult:
    """What the engine found in one file; `new_text` only when the file would change."""

    path: str
    display: str
    kinds: tuple[str, ...]
    status: str = UNCHANGED
    findings: list[Finding] = field(default_factory=list)
    diff: str = ""
    new_text: str | None = None
    encoding: str | None = None
    digest: str = ""  # sha1 of the bytes read, so the writer can refuse a file changed meanwhile
    error: str | None = None
    written: bool = False
    skip: str | None = None
    outside: bool = False  # a symlink to a file outside the scanned paths: reported, never written through


@dataclass
class RunResult:
    """A whole run: per-file results (sorted by display path) and the configuration used."""

    files: list[FileResult]
    config: ProjectConfig
    settings: Settings

    @property
    def findings(self) -> list[Finding]:
        """All findings, in file then line order."""
        return [f for r in self.files for f in r.findings]


PythonPorter = Callable[[str, str, Settings], "tuple[str, list[Finding]]"]


def python_backend() -> tuple[PythonPorter, tuple[bytes, ...], type[Exception]]:
    """The Python rewriter, its pre-filter trigger bytes and the parse error type it raises."""
    import libcst

    from tputool.codemods.python import PYTHON_TRIGGERS, port_python

    return port_python, tuple(PYTHON_TRIGGERS), libcst.ParserSyntaxError


def _parse_error(path: str, line: int, col: int, why: str, settings: Settings, cell: int | None = None
                 ) -> list[Finding]:
    if not settings.enabled("TPU900"):
        return []
    rule = TEXT_RULES["TPU900"]
    return [Finding(path=path, line=max(line, 1), col=max(col, 1), code="TPU900",
                    message=f"{why}; file left untouched", severity=rule.severity,
                    extra={"cell": cell} if cell is not None else {})]


def _too_large(src: SourceFile, settings: Settings, limit: int) -> list[Finding]:
    if not settings.enabled("TPU940"):
        return []
    rule = TEXT_RULES["TPU940"]
    return [Finding(path=src.display, line=1, col=1, code="TPU940", severity=rule.severity,
                    message=f"file is {src.size:,} bytes, over max-file-size ({limit:,}); skipped, not read")]


_ERROR_AT = re.compile(r"^(?:\w+ error: )?error at (\d+):(\d+): ")


def _syntax_position(exc: Exception) -> tuple[int, int, str]:
    """(line, col, one-line reason) of a libcst ParserSyntaxError (or a SyntaxError)."""
    msg = getattr(exc, "message", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    line = getattr(exc, "raw_line", None) or getattr(exc, "lineno", None) or 1
    col = getattr(exc, "raw_column", None)
    col = (col + 1) if isinstance(col, int) else (getattr(exc, "offset", None) or 1)
    m = _ERROR_AT.match(msg)
    if m:
        line, col, msg = int(m.group(1)), int(m.group(2)) + 1, msg[m.end():]
    elif msg.startswith(("parser error: ", "tokenizer error: ")):
        msg = msg.split(": ", 1)[1]
    return int(line), int(col), msg


@contextlib.contextmanager
def _no_gc():
    """No cyclic garbage collection while one file is rewritten.

    libcst builds millions of objects for a big file; every full collection walks all of them, which made
    port time grow with the square of the file size (1 MB: 37 s with, 23 s without). The trees hold almost
    no cycles, so reference counting frees them; the collector runs again as soon as the file is done.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def analyze(src: SourceFile, data: bytes, settings: Settings, run_python: bool, want_diff: bool) -> FileResult:
    """Run every enabled rule over one file's bytes; never raises for bad input (reports TPU900)."""
    res = FileResult(src.path, src.display, tuple(sorted(src.kinds)), digest=hashlib.sha1(data).hexdigest())
    text_kinds = src.kinds - {"python"}
    if src.is_python and not run_python and not text_kinds:
        res.status = PREFILTERED
        return res
    if "notebook" in src.kinds:
        return _analyze_notebook(res, src, data, settings, run_python, want_diff)
    if src.is_python:
        try:
            dec = decode_python(data)
        except (SyntaxError, UnicodeDecodeError, LookupError) as e:
            res.status = UNPARSABLE
            res.findings = _parse_error(src.display, 1, 1, f"cannot decode: {e}", settings)
            return res
        res.encoding = dec.encoding
        if run_python:
            port_python, _, parse_error = python_backend()
            try:
                with _no_gc():
                    new_text, findings = port_python(dec.text, src.display, settings)
            except parse_error as e:
                line, col, msg = _syntax_position(e)
                res.status = UNPARSABLE
                res.findings = _parse_error(src.display, line, col, f"syntax error: {msg}", settings)
                return res
            except RecursionError:
                res.status, res.error = ERROR, "too deeply nested for libcst; left untouched"
                return res
            except Exception as e:  # a rule bug must not stop a run over thousands of files
                where = traceback.extract_tb(e.__traceback__)[-1]
                res.status = ERROR
                res.error = (f"internal error in the Python rules ({type(e).__name__}: {e} at "
                             f"{Path(where.filename).name}:{where.lineno}); file left untouched, please report it")
                return res
            res.findings.extend(findings)
            if new_text != dec.text:
                try:
                    check_encodable(new_text, dec.encoding)
                except UnicodeEncodeError as e:
                    res.status = ERROR
                    res.error = f"rewritten text cannot be encoded as {dec.encoding}: {e.reason}"
                else:
                    res.status = CHANGED
                    res.new_text = new_text
                    if want_diff:
                        res.diff = unified_diff(dec.text, new_text, src.display)
        else:
            res.status = PREFILTERED
        text = dec.text
    else:
        text = decode_text(data).text
    if text_kinds:
        res.findings.extend(scan_text(text, src.display, frozenset(text_kinds), settings))
        res.findings.sort(key=lambda f: (f.line, f.col, f.code))
    return res


def _analyze_notebook(res: FileResult, src: SourceFile, data: bytes, settings: Settings, run_python: bool,
                      want_diff: bool) -> FileResult:
    """A notebook's code cells through the Python rewriter; findings carry their cell number."""
    if not run_python:
        res.status = PREFILTERED
        return res
    dec = decode_text(data)
    try:
        nb = notebook.load(dec.text)
    except notebook.NotebookError as e:
        res.status = UNPARSABLE
        res.findings = _parse_error(src.display, 1, 1, str(e), settings)
        return res
    res.encoding = dec.encoding
    port_python, _, parse_error = python_backend()
    try:
        with _no_gc():
            new_code, findings = port_python(nb.code, src.display, settings)
    except parse_error as e:
        line, col, msg = _syntax_position(e)
        cell, line = nb.locate(line)
        res.status = UNPARSABLE
        res.findings = _parse_error(src.display, line, col, f"syntax error in cell {cell}: {msg}", settings, cell)
        return res
    except RecursionError:
        res.status, res.error = ERROR, "too deeply nested for libcst; left untouched"
        return res
    for f in findings:
        cell, f.line = nb.locate(f.line)
        f.extra = {**f.extra, "cell": cell}
    res.findings = findings
    if new_code != nb.code:
        try:
            new_text = nb.rebuild(new_code)
        except notebook.NotebookError as e:
            res.status, res.error = ERROR, str(e)
            return res
        if new_text != dec.text:
            res.status, res.new_text = CHANGED, new_text
            if want_diff:
                res.diff = unified_diff(dec.text, new_text, src.display)
    return res


def _ignore_sigint() -> None:
    """Pool worker initializer: Ctrl-C is the parent's to handle (no traceback from every worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _analyze_chunk(jobs: list[tuple[SourceFile, bytes, Settings]], want_diff: bool) -> list[FileResult]:
    out = []
    for src, data, st in jobs:
        r = analyze(src, data, st, True, want_diff)
        r.outside = src.outside
        out.append(r)
    return out


def _chunks(items: list, n_workers: int) -> list[list]:
    size = max(1, min(MAX_CHUNK, len(items) // (n_workers * 4) or 1))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _pool_context() -> multiprocessing.context.BaseContext | None:
    """The fork start method when it is safe here, else None (then the engine runs in-process).

    Workers are forked so they inherit the imported libcst and rule modules. A process that already runs
    other threads (an embedding program that imported jax or torch) must not fork, and spawn/forkserver
    would re-import the embedding program's __main__, so such callers get the in-process path.
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    if threading.active_count() > 1 or "jax" in sys.modules or "torch" in sys.modules:
        return None
    return multiprocessing.get_context("fork")


def run(paths: Sequence[str], config: ProjectConfig, *, unsafe_fixes: bool = False, select: Iterable[str] | None = None,
        ignore: Iterable[str] = (), exclude: Sequence[str] = (), only: Iterable[Path] | None = None,
        want_diff: bool = True, jobs: int | None = None,
        progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Analyse every file under `paths` with `config` (CLI select/ignore/exclude/unsafe merged on top).

    `jobs`: worker processes (default: all cores; 1 = in-process). `progress(done, total)` is called as
    files finish. Nothing is written.
    """
    cfg = dataclasses.replace(config, per_file_ignores=dict(config.per_file_ignores))
    if select is not None:
        cfg.select = frozenset(select)
    cfg.ignore = cfg.ignore | frozenset(ignore)
    cfg.unsafe_fixes = cfg.unsafe_fixes or unsafe_fixes
    files = discover(paths, cfg.root, tuple(cfg.exclude) + tuple(exclude), only, cfg.max_file_size)
    total = len(files)
    results: dict[str, FileResult] = {}

    def done(r: FileResult) -> None:
        results[r.path] = r

    pending = _read_and_prefilter(files, cfg, want_diff, done)
    if progress:
        progress(len(results), total)
    n_workers = min(max(1, jobs if jobs is not None else (os.cpu_count() or 1)), len(pending))
    ctx = _pool_context() if n_workers > 1 else None
    if ctx is not None and sum(len(d) for _, d, _ in pending) >= POOL_MIN_BYTES:
        try:
            _in_pool(pending, n_workers, ctx, want_diff, done, lambda: progress and progress(len(results), total))
        except BrokenProcessPool:
            pass  # a worker died (out of memory, a crash in a native parser): finish the rest here
    for src, data, st in pending:
        if src.path not in results:
            done(_analyze_chunk([(src, data, st)], want_diff)[0])
            if progress:
                progress(len(results), total)
    ordered = [results[f.path] for f in files]
    return RunResult(ordered, cfg, Settings(cfg.select, cfg.ignore, cfg.unsafe_fixes))


def run_source(data: bytes, name: str, config: ProjectConfig, *, unsafe_fixes: bool = False,
               select: Iterable[str] | None = None, ignore: Iterable[str] = (), want_diff: bool = True) -> RunResult:
    """Analyse one buffer (standard input) as if it were the file `name` ("-": a Python file)."""
    from tputool.codemods.discover import classify, display_path

    cfg = dataclasses.replace(config, per_file_ignores=dict(config.per_file_ignores))
    if select is not None:
        cfg.select = frozenset(select)
    cfg.ignore = cfg.ignore | frozenset(ignore)
    cfg.unsafe_fixes = cfg.unsafe_fixes or unsafe_fixes
    path = Path(name).absolute()
    kinds = (classify(path.name, path.parent.name) or frozenset({"python"})) if name != "-" else frozenset({"python"})
    try:
        rel = path.relative_to(cfg.root).as_posix()
    except ValueError:
        rel = name
    src = SourceFile(str(path), "-" if name == "-" else display_path(path), rel, kinds, size=len(data))
    st = cfg.settings_for(rel)
    if len(data) > cfg.max_file_size:
        r = FileResult(src.path, src.display, tuple(sorted(kinds)), status=SKIPPED, skip=TOO_LARGE)
        r.findings = _too_large(src, st, cfg.max_file_size)
    else:
        r = analyze(src, data, st, True, want_diff)
    return RunResult([r], cfg, Settings(cfg.select, cfg.ignore, cfg.unsafe_fixes))


Job = tuple[SourceFile, bytes, Settings]


def _read_and_prefilter(files: list[SourceFile], cfg: ProjectConfig, want_diff: bool,
                        done: Callable[[FileResult], None]) -> list[Job]:
    """Read every file; finish the cheap ones (text files, pre-filtered Python) and return the rest."""
    from tputool.rules.catalogue import python_codes

    _, triggers, _ = python_backend() if any(f.is_python for f in files) else (None, (), None)
    py_codes = python_codes()
    pending: list[Job] = []
    for src in files:
        st = cfg.settings_for(src.rel)
        kinds = tuple(sorted(src.kinds))
        data, skip, why = None, src.skip, None
        if skip is None:
            try:
                data = read_regular(src.path, cfg.max_file_size)
            except NotReadable as e:
                skip = str(e)
            except OSError as e:
                why = f"cannot read: {e.strerror or e}"
        if data is None:
            r = FileResult(src.path, src.display, kinds, status=SKIPPED if why is None else ERROR, skip=skip, error=why)
            if skip == TOO_LARGE:
                r.findings = _too_large(src, st, cfg.max_file_size)
            elif why is not None:
                r.findings = _parse_error(src.display, 1, 1, why, st)
            done(r)
            continue
        if src.is_python and any(st.enabled(c) for c in py_codes) and any(t in data for t in triggers):
            pending.append((src, data, st))
        else:
            r = analyze(src, data, st, False, want_diff)
            r.outside = src.outside
            done(r)
    return pending


def _in_pool(pending: list[Job], n_workers: int, ctx: multiprocessing.context.BaseContext, want_diff: bool,
             done: Callable[[FileResult], None], tick: Callable[[], object]) -> None:
    """Analyse `pending` over `n_workers` processes, biggest files first (better balance at the end)."""
    jobs = sorted(pending, key=lambda j: -len(j[1]))
    with ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx, initializer=_ignore_sigint) as pool:
        futs = {pool.submit(_analyze_chunk, chunk, want_diff) for chunk in _chunks(jobs, n_workers)}
        try:
            while futs:
                finished, futs = wait(futs, return_when=FIRST_COMPLETED)
                for fut in finished:
                    for r in fut.result():
                        done(r)
                tick()
        except BaseException:
            # Ctrl-C: do not wait for the chunks in flight. The futures are not cancelled: the pool, finding its
            # workers gone, fails every pending one itself (on Python 3.11 it raises in its own thread when one
            # of them was cancelled first).
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
            pool.shutdown(wait=True)
            raise
