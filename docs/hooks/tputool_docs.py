"""MkDocs hooks that build the site's reference pages from tputool's own data at build time.

- one page per rule code (`rules/<CODE>.md`) from the rule catalogue (`tputool.rules.catalogue`), grouped
  under "Rules" in the nav by code range, and the rule table of `rules/index.md`;
- every command page (`commands/<name>.md`) ends with its options and exit statuses, read from the Typer app
  (`tputool.cli.app`'s click commands); a command with no hand-written page gets a generated one.

Nothing here is written twice: a new rule, command or option appears in the site on the next `make docs`.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

# The checkout's own tputool, whatever the environment has installed (docs/hooks/ -> the repository root).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Code ranges, in the order the nav shows them: label and what a user finds there (data for the nav and the
# range table of rules/index.md; the rules themselves come from the catalogue).
RANGES: dict[str, tuple[str, str]] = {
    "TPU1": ("device placement", '`.cuda()` → `.to("tpu")`, `.cuda(i)` → `.to(torch.device("tpu", i))`, '
             '`device="cuda"`, `f"cuda:{rank}"`, argparse defaults/choices, `t.is_cuda`, `map_location`, '
             "device string checks (review)"),
    "TPU2": ("the torch.cuda API", "`torch.cuda.{is_available,device_count,set_device,synchronize,manual_seed*,"
             "Event,Stream,...}` → `torch.tpu.*`, `is_bf16_supported()` → `True`, `empty_cache()` removed, NVTX → "
             "`record_function`, memory stats → `torch.tpu.*` (summaries/snapshots reported), CUDA graphs / "
             "capability checks reported"),
    "TPU3": ("amp and precision", '`torch.cuda.amp.autocast` → `torch.autocast("tpu", dtype=torch.bfloat16)`, '
             '`autocast("cuda")`, GradScaler (unsafe: `enabled=False`), `custom_fwd/bwd`, fp16 (unsafe → bf16), '
             "fp64 (reported, never downcast)"),
    "TPU4": ("backends, distributed, compile", "cuDNN flags removed, `sdp_kernel`/`sdpa_kernel` unwrapped, "
             '`"nccl"` → `"tpu"`, DDP `device_ids`, DataParallel, `torch.compile(..., backend="tpu")`, Inductor '
             "modes/config, `fused=True`, CUDA/NCCL env vars"),
    "TPU5": ("kernels, extensions, third-party", "Triton, `cpp_extension`/custom ops, apex (fused norms → "
             "`torch.nn`), flash_attn, xformers, bitsandbytes, DeepSpeed, pynvml/nvidia-smi"),
    "TPU6": ("performance lints", "`.item()`/`.cpu()` inside loops, data-dependent shapes, non-128 dims, "
             "hard-coded GPU peak FLOPs"),
    "TPU8": ("diagnose (runtime)", "graph breaks, recompiles, CPU fallbacks, float64/float16, eager flushes, "
             "host-to-device bytes, XLA compiles after warm-up, script failures and timeouts"),
    "TPU9": ("non-Python files", "launch scripts, Dockerfiles, Makefiles, configs, requirements, CUDA sources "
             "(line-oriented findings, never rewritten)"),
}

FIX_SAFETY = {
    "safe": "**safe**: `tputool port` applies the rewrite by default (`tputool check` reports it as fixable).",
    "unsafe": "**unsafe**: the rewrite may change what the program does, so `tputool port` applies it only with "
              "`--unsafe-fixes`; review the change.",
    "none": "**none**: reported only; nothing is rewritten. The finding says what to change.",
}

COMMANDS_DIR = "commands"
RULES_DIR = "rules"
RULE_TABLE_MARKER = "<!-- tputool: rule-table -->"


# ---- data from tputool --------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def cli_commands() -> dict[str, Any]:
    """The tputool app's click commands by name (a group's subcommands as "group sub")."""
    import typer.main

    from tputool.cli import app

    out: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, cmd in sorted(group.commands.items()):
            if getattr(cmd, "hidden", False):
                continue
            out[prefix + name] = cmd
            if hasattr(cmd, "commands"):
                walk(cmd, prefix + name + " ")

    walk(typer.main.get_command(app), "")
    return out


def command_pages() -> dict[str, str]:
    """Each top-level command and the page (docs-relative path) that documents it."""
    return {name: f"{COMMANDS_DIR}/{name}.md" for name in cli_commands() if " " not in name}


def rule_pages() -> dict[str, str]:
    """Each rule code of the catalogue and its generated page."""
    from tputool.rules.catalogue import listed_rules

    return {code: f"{RULES_DIR}/{code}.md" for code in listed_rules()}


def _reported_by(code: str, listed_by: str) -> str:
    from tputool.rules.runtime import BY_CODE

    names = [listed_by]
    if listed_by != "diagnose" and code in BY_CODE:
        names.append("diagnose (with runtime evidence)")
    return ", ".join(names)


# ---- rule pages ----------------------------------------------------------------------------------------------

def _split_doc(doc: str) -> tuple[str, str, str]:
    """A rule doc as (why, fix, example): the text before a line starting `Fix:`, that paragraph, and the
    `Before:`/`After:`/`Example:` part (the catalogue's own layout)."""
    lines = doc.strip("\n").splitlines()
    ex_at = next((i for i, line in enumerate(lines) if line.startswith(("Before:", "Example:"))), len(lines))
    body, example = lines[:ex_at], "\n".join(lines[ex_at:])
    fix_at = next((i for i, line in enumerate(body) if line.startswith("Fix:")), len(body))
    return "\n".join(body[:fix_at]).strip(), "\n".join(body[fix_at:]).strip(), example.strip()


def _code_block(text: str) -> str:
    return f"```python\n{text.rstrip()}\n```\n"


def rule_markdown(code: str) -> str:
    """The page of one rule: what it finds, why, an example before/after, its fix safety."""
    from tputool.rules.catalogue import listed_rules
    from tputool.rules.runtime import FIX

    rule, listed_by = listed_rules()[code]
    why, fix_text, example = _split_doc(rule.doc)
    out = [f"# {rule.code} {rule.name}\n",
           "| class | fix | severity | reported by | CUDA-pattern rows |",
           "|---|---|---|---|---|",
           f"| {rule.rule_class.value} | {rule.fix.value} | {rule.severity} | {_reported_by(code, listed_by)} | "
           f"{', '.join(map(str, rule.patterns)) or '-'} |\n",
           "## What\n", f"The finding reads: *{rule.message}*\n",
           "## Why\n", why + "\n"]
    out.append("## Example\n")
    if rule.before is not None:
        out += ["Before:\n", _code_block(rule.before)]
        if rule.after is not None:
            out += ["After `tputool port`" + (" --unsafe-fixes" if rule.fix.value == "unsafe" else "") + ":\n",
                    _code_block(rule.after)]
        else:
            out.append("`tputool port` leaves this code as it is and reports it.\n")
        out.append("The tests run this example through `tputool port` (`tests/codemods/test_rule_examples.py`).\n")
    elif example.startswith("Example:"):
        out.append(example.removeprefix("Example:").strip() + "\n")
    else:
        how = "`tputool diagnose` reports it from what the script did at run time" if listed_by == "diagnose" \
            else "`tputool check` and `tputool port` report it where they find it"
        out.append(f"No code example: {how}; see *Why* for the patterns it covers.\n")
    out += ["## Fix safety\n", FIX_SAFETY[rule.fix.value] + "\n"]
    if fix_text:
        out.append(fix_text + "\n")
    if code in FIX:
        out.append(f"`tputool diagnose` prints under each finding: *{FIX[code]}*\n")
    out.append(f"`tputool rules {code}` prints this rule's documentation in the terminal.\n")
    return "\n".join(out)


def rule_table_markdown() -> str:
    """rules/index.md's tables: the code ranges, then every rule with a link to its page."""
    from tputool.rules.catalogue import listed_rules

    rules = listed_rules()
    out = ["| range | theme | rules | examples |", "|---|---|---|---|"]
    for prefix, (theme, examples) in RANGES.items():
        n = sum(c.startswith(prefix) for c in rules)
        out.append(f"| {prefix}xx | {theme} | {n} | {examples} |")
    out += ["", "| code | name | class | fix | severity | reported by | finding |", "|---|---|---|---|---|---|---|"]
    for code, (rule, by) in rules.items():
        out.append(f"| [{code}]({code}.md) | {rule.name} | {rule.rule_class.value} | {rule.fix.value} | "
                   f"{rule.severity} | {by} | {rule.message.replace('|', '&#124;')} |")
    return "\n".join(out) + "\n"


def rules_nav() -> list[Any]:
    """The "Rules" nav section: the index page, then one group per code range."""
    from tputool.rules.catalogue import listed_rules

    nav: list[Any] = [f"{RULES_DIR}/index.md"]
    pages, rules = rule_pages(), listed_rules()
    for prefix, (theme, _) in RANGES.items():
        group = [{f"{code} {rules[code][0].name}": path} for code, path in pages.items() if code.startswith(prefix)]
        if group:
            nav.append({f"{prefix}xx {theme}": group})
    missing = [c for c in pages if not any(c.startswith(p) for p in RANGES)]
    if missing:
        raise ValueError(f"rule codes outside every range of docs/hooks/tputool_docs.py RANGES: {missing}")
    return nav


# ---- command pages -------------------------------------------------------------------------------------------

def _opt_names(param: Any) -> str:
    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    return ", ".join(f"`{n}`" for n in names)


def _default(param: Any) -> str:
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return ""
    if isinstance(getattr(param, "show_default", None), str):
        return f"`{param.show_default}`"
    d = param.default
    if d is None or d == () or d == [] or callable(d):
        return ""
    if getattr(param, "secondary_opts", None) and isinstance(d, bool):
        return f"`{param.opts[0] if d else param.secondary_opts[0]}`"
    return f"`{getattr(d, 'value', d)}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "&#124;")


def _help_paragraphs(cmd: Any) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", (cmd.help or "").strip()) if p.strip()]


def exit_status_text(cmd: Any) -> str:
    """The command's exit statuses: the `Exit status` part of its help, else the ones every command shares."""
    from tputool.errors import UserError

    paras = _help_paragraphs(cmd)
    at = next((i for i, p in enumerate(paras) if re.match(r"(?i)exit status", p)), None)
    if at is None:
        for p in paras:  # "... Exit status: 0 ...; 1 ...; 2 ..." at the end of a paragraph
            m = re.search(r"Exit status\b.*", p, re.S)
            if m:
                return " ".join(m.group(0).split()) + "\n"
        return (f"`0` when it succeeds; `{UserError.exit_code}` for bad usage or bad input (one `error:` line, no "
                "traceback); `130` when interrupted (Ctrl-C).\n")
    lines = "\n".join(paras[at:])
    return "```\n" + lines + "\n```\n"


def command_reference(name: str) -> str:
    """The generated part of a command page: usage, options table, exit statuses, for `name` and its subcommands."""
    out = []
    for full, cmd in cli_commands().items():
        if full != name and not full.startswith(name + " "):
            continue
        level = "##" if full == name else "###"
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        opts = [p for p in cmd.params if p.param_type_name == "option"]
        usage = " ".join(["tputool", full, "[OPTIONS]" if opts else "",
                          *(f"[{(p.metavar or p.name).upper()}]" if not p.required else (p.metavar or p.name).upper()
                            for p in args)])
        if getattr(cmd, "context_settings", {}).get("allow_extra_args"):
            usage += " [-- ARGS...]"
        out += [f"{level} Usage{'' if full == name else ' of ' + full}\n", f"```\n{' '.join(usage.split())}\n```\n"]
        if args:
            out += ["| argument | description |", "|---|---|"]
            out += [f"| `{(p.metavar or p.name).upper()}` | {_cell(getattr(p, 'help', ''))} |" for p in args]
            out.append("")
        out += [f"{level} Options\n", "| option | value | default | description |", "|---|---|---|---|"]
        for p in opts:
            value = "" if getattr(p, "is_flag", False) else f"`{p.metavar}`" if p.metavar else ""
            out.append(f"| {_opt_names(p)} | {_cell(value)} | {_default(p)} | {_cell(p.help)} |")
        out.append("| `--help` |  |  | Show the command's help and exit. |\n")
        out += [f"{level} Exit status\n", exit_status_text(cmd)]
    return "\n".join(out)


def generated_command_page(name: str) -> str:
    """The page of a command that has no hand-written one: its help text and its reference."""
    cmd = cli_commands()[name]
    return f"# tputool {name}\n\n" + "\n\n".join(_help_paragraphs(cmd)) + "\n\n"


# ---- the MkDocs hooks ----------------------------------------------------------------------------------------

def on_config(config: Any) -> Any:
    """Expand the nav: the Rules section from the catalogue, and any command missing from the Commands section."""
    nav = config.get("nav") or []
    for i, item in enumerate(nav):
        if isinstance(item, dict) and "Rules" in item:
            nav[i] = {"Rules": rules_nav()}
        if isinstance(item, dict) and "Commands" in item:
            listed = {next(iter(e.values())) if isinstance(e, dict) else e for e in item["Commands"]}
            for name, path in command_pages().items():
                if path not in listed:
                    item["Commands"].append({f"tputool {name}": path})
    return config


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages: every rule's, and every command's that has no hand-written page."""
    from mkdocs.structure.files import File

    for code, path in rule_pages().items():
        files.append(File.generated(config, path, content=rule_markdown(code)))
    for name, path in command_pages().items():
        if files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, content=generated_command_page(name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Append each command page's generated reference; fill rules/index.md's table."""
    src = page.file.src_uri
    for name, path in command_pages().items():
        if src == path:
            return markdown.rstrip() + "\n\n" + command_reference(name)
    if src == f"{RULES_DIR}/index.md":
        if RULE_TABLE_MARKER not in markdown:
            raise ValueError(f"{src} lost its {RULE_TABLE_MARKER} marker")
        return markdown.replace(RULE_TABLE_MARKER, rule_table_markdown())
    return markdown
