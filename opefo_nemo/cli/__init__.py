"""Command-line entry points: ``opefo-train`` and ``opefo-eval`` (wiring only)."""
