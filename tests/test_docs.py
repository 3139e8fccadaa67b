"""The README and the documentation site: every rule code and every command has its page, the README stays short,
and (where MkDocs is installed) the site builds with --strict."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("tputool_docs_hooks", DOCS / "hooks" / "tputool_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _nav_paths(nav) -> set[str]:
    out: set[str] = set()
    for item in nav:
        if isinstance(item, str):
            out.add(item)
        elif isinstance(item, dict):
            for value in item.values():
                out |= _nav_paths(value) if isinstance(value, list) else {value}
    return out


def _expanded_nav() -> set[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    return _nav_paths(_hooks().on_config(config)["nav"])


def test_every_rule_code_has_its_page_in_the_nav():
    from tputool.rules.catalogue import listed_rules

    hooks = _hooks()
    pages = hooks.rule_pages()
    assert set(pages) == set(listed_rules())
    nav = _expanded_nav()
    assert "rules/index.md" in nav
    assert not [p for p in pages.values() if p not in nav]


def test_rule_pages_have_what_why_example_and_fix_safety():
    from tputool.rules.catalogue import listed_rules

    hooks = _hooks()
    for code, (rule, _) in listed_rules().items():
        page = hooks.rule_markdown(code)
        assert page.startswith(f"# {code} {rule.name}\n")
        for heading in ("## What", "## Why", "## Example", "## Fix safety"):
            assert f"\n{heading}\n" in page, (code, heading)
        if rule.before is not None:
            assert rule.before.rstrip() in page and (rule.after is None or rule.after.rstrip() in page)
        why = page.split("\n## Why\n")[1].split("\n## Example\n")[0]
        assert "Before:" not in why and "\nFix:" not in why, code  # the doc's example and fix have their sections


def test_every_command_has_its_page_and_every_option_its_row():
    hooks = _hooks()
    commands = hooks.cli_commands()
    pages = hooks.command_pages()
    assert {name for name in commands if " " not in name} == set(pages)
    nav = _expanded_nav()
    for name, path in pages.items():
        assert path in nav, name
        reference = hooks.command_reference(name)
        assert "Exit status" in reference
        for param in commands[name].params:
            if param.param_type_name == "option":
                assert f"`{param.opts[0]}`" in reference, (name, param.opts)
    hand_written = {p.stem for p in (DOCS / "commands").glob("*.md")}
    assert hand_written <= set(pages), f"pages for commands the CLI lacks: {hand_written - set(pages)}"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    block = lines[lines.index("```") + 1:]
    assert lines.index("```") <= 2
    assert block[0].startswith("make demo ") and block[1].startswith("make test ")


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert targets
    assert not [t for t in targets if not (ROOT / t).exists()]


def test_every_environment_variable_is_documented():
    used = set()
    for f in (ROOT / "tputool").rglob("*.py"):
        used |= set(re.findall(r"\bTPUTOOL_[A-Z0-9_]+", f.read_text(encoding="utf-8")))
    documented = set(re.findall(r"`(TPUTOOL_[A-Z0-9_]+)", (DOCS / "device.md").read_text(encoding="utf-8")))
    assert used and not used - documented, f"undocumented in docs/device.md: {sorted(used - documented)}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs / mkdocs-material not installed (pip install -e '.[docs]')")
def test_site_builds_strict(tmp_path):
    from tputool.rules.catalogue import listed_rules

    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    missing = [c for c in listed_rules() if not (site / "rules" / c / "index.html").exists()]
    assert not missing
    tune = (site / "commands" / "tune" / "index.html").read_text(encoding="utf-8")
    assert "--global-batch" in tune and "Exit status" in tune
