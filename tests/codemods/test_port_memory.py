"""Structure that keeps `tputool port`'s memory per MB of source low (the megabytes themselves are measured by
benchmarks/port_speed.py --memory, never asserted here)."""

from __future__ import annotations

import io

import pytest

from tputool.codemods.python import context, port_python
from tputool.rules.model import Finding, Settings, Severity

SOURCE = '''import torch

def step(model, batch):
    model = model.cuda()
    batch = batch.cuda()
    torch.cuda.synchronize()
    torch.cuda.synchronize()
    with torch.cuda.amp.autocast():
        y = model(batch)
    return y.to("cuda")
'''


def test_findings_with_the_same_extra_share_one_dict():
    _, findings = port_python(SOURCE, "a.py", Settings())
    assert len(findings) >= 5
    by_value: dict[tuple, list[Finding]] = {}
    for f in findings:
        by_value.setdefault(tuple(f.extra.items()), []).append(f)
    assert any(len(group) > 1 for group in by_value.values())
    for group in by_value.values():
        assert all(f.extra is group[0].extra for f in group)
    _, again = port_python(SOURCE, "b.py", Settings())  # the next file's findings share them too
    assert [f.extra for f in again] == [f.extra for f in findings]
    assert all(f.extra is g.extra for f, g in zip(again, findings, strict=True))


def test_shared_extras_are_bounded_and_keep_their_keys_in_order(monkeypatch):
    monkeypatch.setattr(context, "_EXTRAS", {})
    monkeypatch.setattr(context, "EXTRAS_MAX", 3)
    made = [context.shared_extra("r", True, f"note {k}") for k in range(7)]
    assert [list(e) for e in made] == [["rule", "fix", "note"]] * 7
    assert len(context._EXTRAS) <= 3
    assert context.shared_extra("r", False, None) == {"rule": "r"}
    assert context.shared_extra("r", False, "") is context.shared_extra("r", False, None)


def test_diagnose_costs_do_not_write_into_a_shared_extra():
    from tputool.diagnose import cost
    from tputool.diagnose.record import RunRecord

    shared = {"rule": "host-sync"}
    a, b = (Finding(path="t.py", line=n, col=1, code="TPU601", message="m", severity=Severity.WARNING,
                    extra=shared, per_step=1.0, source="runtime") for n in (1, 2))
    static = Finding(path="t.py", line=3, col=1, code="TPU601", message="m", severity=Severity.WARNING, extra=shared)
    cost.attach([a, static], RunRecord(script="t.py", argv=[], status="ok", steps=10))
    assert a.extra["cost_basis"] == "estimated" and "cost_ms" in a.extra
    assert shared == {"rule": "host-sync"} and b.extra is shared and static.extra is shared


def test_windows_masked_texts_are_made_when_needed(monkeypatch):
    # a window's masked text is made from its plan when the window is read (gathering the file's facts, then
    # porting it), never every window's at once: that cost the file's text again
    import weakref

    import tputool.codemods.python as python
    from tputool.codemods.python.speed import cold

    made: list = []
    most = [0]
    real = cold.Hider.build

    def build(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        made.append(weakref.ref(result))
        most[0] = max(most[0], sum(r() is not None for r in made))
        return result

    monkeypatch.setattr(cold.Hider, "build", build)
    monkeypatch.setattr(python, "WINDOW_CHARS", 1)
    monkeypatch.setattr(python, "WINDOW_SIZE", 1)
    source = "import torch\n" + "".join(f"\ndef f{k}(x):\n    return x.cuda()\n" for k in range(12))
    new, findings = port_python(source, "a.py", Settings())
    assert new == source.replace(".cuda()", '.to("tpu")') and len(findings) == 12
    assert len(made) == 2 * 13 and most[0] <= 2


SOURCES = [
    "import torch\n\nx = 1\n",
    "import torch\r\n\r\ndef f(x):\r\n    return x.cuda()\r\n\r\ny = 2",
    "a = 1\rb = (2,\r     3)\rclass C:\r    pass\r",
    "s = '''\n\u2028 \x0c \x85\n'''\n\x0cdef f():\n    return 1\n@dec\n\ndef g(): pass\nif x:\n    y\nelse:\n    z\n",
    "x = 1; y = 2\ntry:\n    pass\nexcept E:\n    pass\nfinally:\n    pass\n# end",
    "def f(:\n",  # refused by the tokenizer: None
]


@pytest.mark.parametrize("source", SOURCES)
def test_module_units_tokenize_the_text_itself(source, monkeypatch):
    # the same units as tokenizing an io.StringIO of the text, without making one (4 bytes per character)
    import io
    import tokenize

    from tputool.codemods.python.speed import windows

    made = []
    monkeypatch.setattr(tokenize, "generate_tokens", _remember(tokenize.generate_tokens, made))
    got = windows.module_units(source)
    monkeypatch.undo()
    assert made == ["readline"]
    real = io.StringIO
    monkeypatch.setattr(windows.tokenize, "generate_tokens",
                        lambda readline, _gen=tokenize.generate_tokens: _gen(real(source).readline))
    assert got == windows.module_units(source)


def _remember(gen, made):
    def spy(readline):
        made.append("readline" if not isinstance(getattr(readline, "__self__", None), io.StringIO) else "StringIO")
        return gen(readline)
    return spy


def test_big_files_are_parsed_about_8_kb_at_a_time(monkeypatch):
    # libcst's trees (~0.5 GB per MB of the text parsed) are made a window of about 8 kB at a time
    import tputool.codemods.python as python
    import tputool.codemods.python.speed.windows as windows

    sizes: list[int] = []
    real = python.cst.parse_module

    def parse(text, *args, **kwargs):
        sizes.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(python.cst, "parse_module", parse)
    source = "import torch\n" + "".join(f"\ndef f{k}(x):\n    y = x + {k}\n    return y.cuda()\n"
                                        for k in range(4000))
    assert len(source) > python.WINDOW_CHARS
    new, findings = port_python(source, "big.py", Settings())
    assert len(findings) == 4000 and new.count('.to("tpu")') == 4000
    assert windows.cst.parse_module is parse and len(sizes) > 2 * len(source) / 9_000
    assert max(sizes) < 9_000  # (a window ends with the statement that crosses 8 kB; its markers)


@pytest.mark.parametrize("text", ["", "a", "a\n", "a\r\nb\rc\n\nd", "x\x0cy\u2028z\n\r\r\n", "\n\n\n", "é\r"])
def test_source_lines_are_the_split_lines_as_slices_of_the_text(text):
    from tputool.codemods.python.speed.cold import SourceLines, join, line_starts, split_lines

    want = split_lines(text)
    lines = SourceLines(text)
    assert len(lines) == len(want) and list(lines[:]) == want == [lines[k] for k in range(len(lines))]
    assert lines[1:3] == want[1:3] and (not want or lines[-1] == want[-1])
    assert line_starts(lines) == line_starts(want)
    for a in range(len(want) + 1):
        for b in range(len(want) + 2):
            assert join(lines, a, b) == join(want, a, b) == "".join(want[a:b])
    with pytest.raises(IndexError):
        lines[len(want)]


def test_a_windowed_port_holds_no_string_per_line(monkeypatch):
    # the file's lines are read as slices of its text when needed (SourceLines), never all split into strings
    import tputool.codemods.python as python
    from tputool.codemods.python.speed import cold

    source = "import torch\n" + "".join(f"\ndef f{k}(x):\n    return x.cuda()\n" for k in range(5))
    real = cold.split_lines

    def split(text):  # (a window's text is split: it is small)
        assert text != source, "a windowed port split the whole file into line strings"
        return real(text)

    monkeypatch.setattr(python, "WINDOW_CHARS", 1)
    monkeypatch.setattr(python, "WINDOW_SIZE", 1)
    monkeypatch.setattr(cold, "split_lines", split)
    monkeypatch.setattr(cold, "shared_lines", split, raising=False)
    new, findings = port_python(source, "a.py", Settings())
    assert new == source.replace(".cuda()", '.to("tpu")') and len(findings) == 5


def test_each_window_is_given_each_distinct_outside_binding_once(monkeypatch):
    # a file that imports the same module in every window (and rebinds `device` in some) gave each window every
    # other window's copy of the binding: its scope analysis linked each access to all of them (memory and time
    # that grew with the file); equal bindings on one side are given once, and the port is the whole file's
    import tputool.codemods.python as python
    from tputool.codemods.python import _port
    from tputool.codemods.python.speed import names, windows
    from tputool.codemods.python.tables import RELEVANT_ROOTS

    copy = ("\nimport torch as T\nfrom torch import device\n\ndef f{k}(x, device):\n    return x.to(device)\n\n"
            "d{k} = device('cuda') if {k} % 2 else T.zeros(1).cuda()\n{rebind}")
    source = "".join(copy.format(k=k, rebind="device = 'cpu'\n" if k == 5 else "") for k in range(12))
    given: list[tuple[list, list]] = []
    real = windows.FileFacts.outside

    def spy(self, k, text):
        given.append(real(self, k, text))
        return given[-1]

    monkeypatch.setattr(python, "WINDOW_CHARS", 1)
    monkeypatch.setattr(python, "WINDOW_SIZE", 1)
    monkeypatch.setattr(windows.FileFacts, "outside", spy)
    new, findings = port_python(source, "f.py", Settings())
    index = names.build_index(source, RELEVANT_ROOTS)
    assert not index.exact
    assert (new, findings) == _port(source, "f.py", Settings(), index, None, whole=True)
    assert len(given) > 12 and findings
    for earlier, later in given:
        for side in (earlier, later):
            assert len(side) == len(set(side)) <= 4  # T, device (import, assignment), at most one of each a side
