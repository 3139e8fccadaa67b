"""The rule catalogue below the tools: rule metadata, the one `Finding` type and the suppression-comment parser.

`codemods` (port/check) and `diagnose` both import it; it imports neither.
"""
