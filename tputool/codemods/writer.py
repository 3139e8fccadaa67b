"""Write ported files without ever leaving one half-written.

A file with one link is replaced atomically: the new bytes go to a temp file in the same directory
(same permission bits, fsynced), then `os.replace`. A file with several hard links is rewritten in place,
so every link sees the new text: the full new text is first made durable in a temp file beside it, then
copied over the original inode and fsynced; if that copy fails (disk full, Ctrl-C) the original bytes are
put back. The trade-off: only a crash of the machine or a SIGKILL during that copy can leave the original
half-written, and then the temp copy (`.NAME.*.tputool-tmp`) holds the complete new text.
Read-only files and symlinks to files outside the scanned paths are reported and never written.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile

from tputool.codemods.engine import CHANGED, ERROR, FileResult, RunResult
from tputool.codemods.textio import encode


def _temp_copy(target: str, data: bytes, mode: int) -> str:
    """A fsynced temp file beside `target` holding `data` with permission bits `mode`; returns its path."""
    directory, name = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tputool-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_atomic(path: str, data: bytes) -> None:
    """Replace the file at `path` (following symlinks) with `data`, keeping its permission bits (a new file
    gets the default ones: 0o666 less the umask).

    Either the old or the new content is on disk at any moment; on failure the temp file is removed.
    """
    target = os.path.realpath(path)
    if os.path.exists(target):
        mode = stat.S_IMODE(os.stat(target).st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp = _temp_copy(target, data, mode)
    try:
        os.replace(tmp, target)
    except BaseException:
        _unlink(tmp)
        raise


def write_in_place(path: str, data: bytes, old: bytes) -> None:
    """Rewrite the file at `path` through its own inode (hard links keep sharing it); `old` is its content.

    The new text is durable in a temp file first; a failed copy restores `old` before re-raising.
    """
    target = os.path.realpath(path)
    tmp = _temp_copy(target, data, 0o600)
    try:
        with open(target, "r+b") as f:
            try:
                f.write(data)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
            except BaseException:
                f.seek(0)
                f.write(old)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
                raise
    finally:
        _unlink(tmp)


def refusal(path: str) -> str | None:
    """Why the file at `path` must not be written (read-only), or None."""
    st = os.stat(path)
    if not st.st_mode & stat.S_IWUSR or not os.access(path, os.W_OK):
        return "file is read-only; not written"
    return None


def _not_written(r: FileResult, why: str) -> None:
    """Mark a changed file that was not written: an error, and its findings no longer count as fixed."""
    r.status, r.error = ERROR, why
    for f in r.findings:
        if f.fixed:
            f.fixed = f.fixable = False


def apply(result: RunResult) -> int:
    """Write every changed file of `result`; returns how many were written.

    A file whose bytes changed since it was read, that is read-only, reached through a symlink from
    outside the scanned paths, or that cannot be written is marked ERROR, its fixes unapplied, and skipped.
    On KeyboardInterrupt a file whose new bytes already reached the disk is still marked written.
    """
    written = 0
    for r in result.files:
        if r.status != CHANGED or r.new_text is None or r.encoding is None:
            continue
        if r.outside:
            _not_written(r, "symlink to a file outside the scanned paths; not written through")
            continue
        data = b""
        try:
            with open(r.path, "rb") as f:
                old = f.read()
            if hashlib.sha1(old).hexdigest() != r.digest:
                _not_written(r, "file changed on disk while porting; not written")
                continue
            why = refusal(r.path)
            if why is not None:
                _not_written(r, why)
                continue
            data = encode(r.new_text, r.encoding)
            if os.stat(r.path).st_nlink > 1:
                write_in_place(r.path, data, old)
            else:
                write_atomic(r.path, data)
        except OSError as e:
            _not_written(r, f"cannot write: {e.strerror or e}")
            continue
        except KeyboardInterrupt:
            r.written = bool(data) and _holds(r.path, data)
            raise
        r.written = True
        written += 1
    return written


def _holds(path: str, data: bytes) -> bool:
    """Whether the file at `path` now holds exactly `data` (an interrupted write may or may not have landed)."""
    try:
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False
