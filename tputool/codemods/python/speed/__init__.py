"""The port's speed machinery, fenced off from the rules: what lets the rewriter skip work without changing
what it writes.

- `cold_triggers` / `cold`: hide the statements no rule can touch, so libcst parses and visits only the rest;
- `names`: qualified-name resolution from a file's imports (cheaper than libcst's scope analysis);
- `positions`: node start positions (cheaper than libcst's PositionProvider);
- `imports_prune`: drop imports the rewrites left unused, without a scope pass.

The rule handlers (`codemods/python/device.py`, `amp.py`, ...) read like plain libcst codemods; only
`codemods/python/__init__.py` (the pipeline) and `context.py` (what handlers see) use this package.
"""
