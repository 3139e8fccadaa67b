"""A small `.gitignore` reader for directory walks: `dir/`, `*.ext`, `/anchored`, `a/b`, `!negation`, `**`.

Each `.gitignore` applies to the directory holding it and below; a deeper file's rules win over a
shallower one's, and within one file the last matching rule wins (git's order). An ignored directory is
not descended into, so a negation cannot re-include a file below it (as in git).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _translate(glob: str) -> str:
    """A gitignore glob (no leading/trailing slash) -> a regex over a posix path relative to its file."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = glob.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = glob[i + 1:j].replace("\\", "\\\\")
                out.append("[^" + body[1:] + "]" if body[:1] in "!^" and body else "[" + body + "]")
                i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse(text: str) -> list[_Rule]:
    """The rules of one .gitignore file, in file order."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if raw.endswith("\\ "):
            line += " "
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        rules.append(_Rule(re.compile(body if anchored else f"(?:.*/)?{body}", re.DOTALL), negate, dir_only))
    return rules


class Ignores:
    """The .gitignore files met on a walk, by directory; `ignored(path, is_dir)` asks all that apply."""

    def __init__(self) -> None:
        self._by_dir: dict[Path, list[_Rule]] = {}

    def load(self, directory: Path) -> None:
        """Read `directory/.gitignore` if there is one (unreadable files are ignored, as git does)."""
        if directory in self._by_dir:
            return
        try:
            text = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        self._by_dir[directory] = parse(text)

    def ignored(self, path: Path, is_dir: bool) -> bool:
        """True when the nearest .gitignore rule that matches `path` ignores it (deepest file first)."""
        for directory in (path.parent, *path.parent.parents):
            rules = self._by_dir.get(directory)
            if not rules:
                continue
            rel = path.relative_to(directory).as_posix()
            for rule in reversed(rules):
                if (is_dir or not rule.dir_only) and rule.regex.fullmatch(rel):
                    return not rule.negate
        return False
