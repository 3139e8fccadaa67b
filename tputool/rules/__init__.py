"""The rule catalogue below the tools: rule metadata (`port`, `text`, `runtime`, merged by `catalogue`), port/check's
`Finding`, and the one suppression-comment parser. (diagnose's report keeps a `Finding` of its own, with
counts and per-step rates; folding the two is open.)

`codemods` (port/check) and `diagnose` both import it; it imports neither.
"""
