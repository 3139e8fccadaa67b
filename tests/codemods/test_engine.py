"""The engine as a library: pre-filter, pool vs in-process equality, diff format."""

from __future__ import annotations

from tests.codemods.helpers import TRAIN, write
from tputool.codemods import engine
from tputool.codemods.config import ProjectConfig


def _run(root, **kw):
    return engine.run([str(root)], ProjectConfig(root=root), **kw)


def test_prefilter_skips_files_without_trigger_bytes(tmp_path):
    write(tmp_path, "a.py", "def f():\n    return 1\n")
    write(tmp_path, "b.py", TRAIN)
    res = _run(tmp_path, jobs=1)
    status = {r.display.rsplit("/", 1)[-1]: r.status for r in res.files}
    assert status == {"a.py": engine.PREFILTERED, "b.py": engine.CHANGED}


def test_pool_gives_the_same_results_as_in_process(tmp_path, monkeypatch):
    for i in range(12):
        write(tmp_path, f"m{i}.py", TRAIN + f"y{i} = {i}\n" + ("z = w.cuda()\n" * (i % 3)))
    write(tmp_path, "bad.py", "x.cuda(\n")
    seq = _run(tmp_path, jobs=1)
    import multiprocessing

    monkeypatch.setattr(engine, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(engine, "_pool_context", lambda: multiprocessing.get_context("fork"))
    pools = []

    class Recording(engine.ProcessPoolExecutor):
        def __init__(self, *a, **k):
            pools.append(k.get("max_workers"))
            super().__init__(*a, **k)

    monkeypatch.setattr(engine, "ProcessPoolExecutor", Recording)
    seen = []
    par = _run(tmp_path, jobs=2, progress=lambda d, t: seen.append((d, t)))
    assert pools == [2]
    assert [(r.display, r.status, r.diff, [(f.line, f.code) for f in r.findings]) for r in seq.files] == \
           [(r.display, r.status, r.diff, [(f.line, f.code) for f in r.findings]) for r in par.files]
    assert seen[-1] == (13, 13)


def test_skip_dirs_hidden_dirs_and_excludes(tmp_path):
    for d in (".git", ".venv", "venv", "node_modules", "build", "__pycache__", ".hidden", "keep", "legacy"):
        write(tmp_path, f"{d}/x.py", TRAIN)
    res = engine.run([str(tmp_path)], ProjectConfig(root=tmp_path), exclude=["legacy"], jobs=1)
    assert [r.display.rsplit("/", 2)[-2] for r in res.files] == ["keep"]


def test_unified_diff_marks_missing_final_newline():
    d = engine.unified_diff("a.cuda()", 'a.to("tpu")', "x.py")
    assert d.splitlines()[:2] == ["--- a/x.py", "+++ b/x.py"]
    assert "\\ No newline at end of file" in d


def test_a_crashing_rule_is_reported_not_fatal(tmp_path, monkeypatch):
    write(tmp_path, "a.py", TRAIN)
    write(tmp_path, "b.sh", "export CUDA_VISIBLE_DEVICES=0\n")
    real = engine.python_backend

    def broken():
        _, triggers, err = real()

        def port_python(source, path, settings):
            raise KeyError("boom")

        return port_python, triggers, err

    monkeypatch.setattr(engine, "python_backend", broken)
    res = _run(tmp_path, jobs=1)
    by_name = {r.display.rsplit("/", 1)[-1]: r for r in res.files}
    assert by_name["a.py"].status == engine.ERROR and "KeyError" in by_name["a.py"].error
    assert [f.code for f in by_name["b.sh"].findings] == ["TPU901"]


def test_progress_bar_only_on_a_tty_with_many_files(monkeypatch, capsys):
    import sys

    from tputool.cli.port import _Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    quiet = _Progress(True)
    quiet(0, 10_000)
    assert quiet.bar is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    few = _Progress(True)
    few(0, 10)
    assert few.bar is None
    many = _Progress(True)
    many(0, 500)
    many(500, 500)
    assert many.bar is not None and many.bar.tasks[0].completed == 500
    many.close()


def test_no_fork_in_threaded_processes(monkeypatch):
    import sys
    import threading

    monkeypatch.delitem(sys.modules, "jax", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert engine._pool_context().get_start_method() == "fork"
    monkeypatch.setattr(threading, "active_count", lambda: 3)
    assert engine._pool_context() is None  # a threaded embedding process: in-process, never fork


_PARENT = None


def _dying_chunk(jobs, want_diff):
    import os

    if os.getpid() != _PARENT:
        os._exit(1)  # the worker process crashes
    return [engine.analyze(src, data, st, True, want_diff) for src, data, st in jobs]


def test_a_dying_worker_falls_back_to_in_process(tmp_path, monkeypatch):
    import multiprocessing
    import os

    global _PARENT
    _PARENT = os.getpid()
    for i in range(4):
        write(tmp_path, f"m{i}.py", TRAIN)
    monkeypatch.setattr(engine, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(engine, "_pool_context", lambda: multiprocessing.get_context("fork"))
    monkeypatch.setattr(engine, "_analyze_chunk", _dying_chunk)
    res = _run(tmp_path, jobs=2)
    assert [r.status for r in res.files] == [engine.CHANGED] * 4
