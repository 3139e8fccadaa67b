"""Unified diffs whose cost grows about linearly with the file (difflib alone is quadratic on big files).

difflib.SequenceMatcher splits the files at the longest common block and recurses; when the changes are
spread evenly through a big file (a generated module with a `.cuda()` every few lines) each split is
lopsided and the work grows with the square of the line count (500 KB: 14 s of 23). Here the lines that
occur exactly once in each file, in an order both files share (patience diff's anchors: a longest
increasing subsequence, O(n log n)), cut the files into small gaps first, and only the gaps go through
difflib. The hunks are printed in the usual `--- a/` `+++ b/` `@@` format.
"""

from __future__ import annotations

import bisect
from collections import Counter
from difflib import Match, SequenceMatcher


def _anchors(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """(i, j) pairs of lines unique in both files, forming the longest chain increasing in both i and j."""
    count_a, count_b = Counter(a), Counter(b)
    where_b = {line: j for j, line in enumerate(b) if count_b[line] == 1}
    pairs = [(i, where_b[line]) for i, line in enumerate(a) if count_a[line] == 1 and line in where_b]
    tails: list[int] = []  # tails[k]: j of the smallest tail of an increasing chain of length k + 1
    tail_at: list[int] = []  # index in `pairs` of that tail
    back = [-1] * len(pairs)
    for n, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tails, j)
        back[n] = tail_at[k - 1] if k else -1
        if k == len(tails):
            tails.append(j)
            tail_at.append(n)
        else:
            tails[k], tail_at[k] = j, n
    chain, n = [], tail_at[-1] if tail_at else -1
    while n >= 0:
        chain.append(pairs[n])
        n = back[n]
    return chain[::-1]


def matching_blocks(a: list[str], b: list[str]) -> list[Match]:
    """difflib-style matching blocks of `a` and `b` (ending with the (len a, len b, 0) sentinel)."""
    blocks: list[list[int]] = []

    def add(i: int, j: int, n: int) -> None:
        if blocks and blocks[-1][0] + blocks[-1][2] == i and blocks[-1][1] + blocks[-1][2] == j:
            blocks[-1][2] += n
        elif n:
            blocks.append([i, j, n])

    i0 = j0 = 0
    for i, j in [*_anchors(a, b), (len(a), len(b))]:
        if i > i0 and j > j0:
            for bi, bj, n in SequenceMatcher(None, a[i0:i], b[j0:j], autojunk=False).get_matching_blocks():
                add(i0 + bi, j0 + bj, n)
        if i < len(a):
            add(i, j, 1)
        i0, j0 = i + 1, j + 1
    return [Match(*blk) for blk in blocks] + [Match(len(a), len(b), 0)]


def _range(start: int, stop: int) -> str:
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def unified_diff(old: str, new: str, display: str, context: int = 3) -> str:
    """A git-style unified diff (a/ and b/ prefixes); marks a missing final newline like diff(1)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    sm = SequenceMatcher(None, (), ())
    sm.a, sm.b = a, b
    sm.matching_blocks, sm.opcodes = matching_blocks(a, b), None
    name = display.lstrip("/")
    out: list[str] = []
    for group in sm.get_grouped_opcodes(context):
        if not out:
            out += [f"--- a/{name}\n", f"+++ b/{name}\n"]
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in a[i1:i2]]
                continue
            out += ["-" + line for line in a[i1:i2]]
            out += ["+" + line for line in b[j1:j2]]
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)
