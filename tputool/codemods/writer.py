"""Write ported files atomically: temp file in the same directory, same mode, then os.replace."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile

from tputool.codemods.engine import CHANGED, ERROR, RunResult
from tputool.codemods.textio import encode


def write_atomic(path: str, data: bytes) -> None:
    """Replace the file at `path` (following symlinks) with `data`, keeping its permission bits.

    Either the old or the new content is on disk at any moment; on failure the temp file is removed.
    """
    target = os.path.realpath(path)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    directory, name = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tputool-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def apply(result: RunResult) -> int:
    """Write every changed file of `result`; returns how many were written.

    A file whose bytes changed since it was read, or that cannot be written, is marked ERROR and skipped.
    """
    written = 0
    for r in result.files:
        if r.status != CHANGED or r.new_text is None or r.encoding is None:
            continue
        try:
            with open(r.path, "rb") as f:
                if hashlib.sha1(f.read()).hexdigest() != r.digest:
                    r.status, r.error = ERROR, "file changed on disk while porting; not written"
                    continue
            write_atomic(r.path, encode(r.new_text, r.encoding))
        except OSError as e:
            r.status, r.error = ERROR, f"cannot write: {e.strerror or e}"
            continue
        r.written = True
        written += 1
    return written
