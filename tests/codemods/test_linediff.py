"""linediff.unified_diff makes its opcodes and hunks one at a time and splits lines a block at a time: the same
diff as difflib's own grouping of the same matching blocks, rendered from whole line lists."""

from __future__ import annotations

import random
from collections import Counter
from difflib import Match, SequenceMatcher

import pytest

from tputool.codemods import linediff


def _reference(old: str, new: str, name: str, context: int) -> str:
    """The diff as linediff made it before it streamed: whole line lists, difflib's get_grouped_opcodes."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    counts = Counter(a)
    bi, bj, bn = linediff._blocks(a, b, {x: x for x in a}, {x for x, n in counts.items() if n > 1})
    sm = SequenceMatcher(None, (), ())
    sm.a, sm.b = a, b
    sm.matching_blocks = [Match(*m) for m in zip(bi, bj, bn, strict=True)] + [Match(len(a), len(b), 0)]
    sm.opcodes = None
    out: list[str] = []

    def lines(prefix: str, seq: list[str], i: int, j: int) -> None:
        for line in seq[i:j]:
            out.append(prefix + line if line.endswith("\n") else prefix + line + "\n\\ No newline at end of file\n")

    for group in sm.get_grouped_opcodes(context):
        if not out:
            out += [f"--- a/{name}\n", f"+++ b/{name}\n"]
        first, last = group[0], group[-1]
        out.append(f"@@ -{linediff._range(first[1], last[2])} +{linediff._range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines(" ", a, i1, i2)
            else:
                lines("-", a, i1, i2)
                lines("+", b, j1, j2)
    return "".join(out)


# every line break str.splitlines knows
BREAKS = ["\n", "\r\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 16])
def test_streamed_diff_equals_difflib_grouping(monkeypatch, block):
    monkeypatch.setattr(linediff, "_SPLIT_BLOCK", block)
    rng = random.Random(block)
    for trial in range(300):
        pool = ["a", "b", "x = 1", "", "    y.cuda()", f"u{trial}", "é"]
        breaks = BREAKS if trial % 3 == 0 else ["\n"]
        lines = [rng.choice(pool) + rng.choice(breaks) for _ in range(rng.randint(0, 50))]
        old = "".join(lines)
        for _ in range(rng.randint(0, 8)):
            op, at = rng.random(), rng.randint(0, len(lines))
            if op < 0.3 and at < len(lines):
                del lines[at]
            elif op < 0.6:
                lines.insert(at, rng.choice([*pool, "new"]) + rng.choice(breaks))
            elif at < len(lines):
                lines[at] = "changed\n"
        new = "".join(lines)
        if trial % 4 == 0:
            new = new.rstrip("\n")
        if trial % 7 == 0:
            old = old.rstrip("\n")
        assert list(linediff.split_lines(old)) == old.splitlines(keepends=True)
        for context in (0, 1, 3):
            assert linediff.unified_diff(old, new, "f.py", context) == _reference(old, new, "f.py", context)


def test_streamed_diff_of_a_big_evenly_changed_file(monkeypatch):
    monkeypatch.setattr(linediff, "_SPLIT_BLOCK", 4096)
    old = "".join(f"def f_{i}(m):\n    m = m.cuda()\n\n    return m\n" for i in range(3000))
    new = old.replace("m.cuda()", "m.to('tpu')", 2000).replace("return m\n", "return m  # ok\n", 1000)
    assert linediff.unified_diff(old, new, "g.py") == _reference(old, new, "g.py", 3)
    assert linediff.unified_diff(old, old, "g.py") == "" == _reference(old, old, "g.py", 3)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "latin-1", "cp1252", "ascii", "utf-16"])
@pytest.mark.parametrize("text", ["x = 'ok'\n" * 50, "s = 'é€'\n" * 50, "y = '\udc80'\n", "z = '中'\n" * 40])
def test_check_encodable_fails_where_encoding_the_whole_text_fails(encoding, text):
    """engine checks that a big rewritten file can be written back a block at a time (textio.check_encodable)."""
    from tputool.codemods.textio import check_encodable, encode

    try:
        encode(text, encoding)
    except UnicodeEncodeError as e:
        with pytest.raises(UnicodeEncodeError) as block:
            check_encodable(text, encoding, block=7)
        assert block.value.reason == e.reason
    else:
        check_encodable(text, encoding, block=7)


def test_the_diff_is_joined_from_the_lines_themselves():
    # no new string per line (nor blocks of lines): each piece is a line of either file, its prefix, a header or
    # the missing-newline mark, so the diff's text is held once, beside a list of references
    old = "".join(f"x{k % 7} = torch.device('cuda')\n" if k % 5 == 0 else f"y = {k}\n" for k in range(400)) + "end"
    new = old.replace("cuda", "tpu").replace("\nend", "\nend\n")
    a, b, in_a, repeated = linediff._read(old, new)
    bi, bj, bn = linediff._blocks(a, b, in_a, repeated)
    pieces = linediff.diff_pieces(a, b, linediff._hunks(linediff._opcodes(bi, bj, bn, len(a), len(b)), 3), "/m.py")
    ids = {id(x) for x in a} | {id(x) for x in b}
    lines = [p for p in pieces if id(p) in ids]
    assert len(lines) > 200
    rest = [p for p in pieces if id(p) not in ids]
    assert set(rest) - {" ", "-", "+", linediff.NO_NEWLINE} == {p for p in rest if p.startswith(("---", "@@"))}
    assert "".join(pieces) == linediff.unified_diff(old, new, "/m.py") == _reference(old, new, "m.py", 3)
