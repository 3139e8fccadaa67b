"""The command outputs shown in the docs are the outputs of real runs (`python -m tputool.docs_examples`)."""

import pytest

from tputool import docs_examples


@pytest.mark.parametrize("name", sorted(docs_examples.EXAMPLES))
def test_committed_example_matches_a_fresh_run(name):
    committed = (docs_examples.OUT_DIR / f"{name}.txt").read_text(encoding="utf-8")
    assert docs_examples.render(name) == committed, (
        f"docs/examples/{name}.txt is stale: run `python -m tputool.docs_examples` and commit the result")


def test_every_example_is_shown_in_the_docs():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (docs_examples.ROOT / "docs").rglob("*.md"))
    for name in docs_examples.EXAMPLES:
        assert f'--8<-- "docs/examples/{name}.txt"' in pages, f"docs/examples/{name}.txt is shown on no page"
