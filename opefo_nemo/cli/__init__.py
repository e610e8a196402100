"""Command-line entry points, Hydra/argparse wiring only (see ARCHITECTURE.md): ``opefo-train``,
``opefo-eval``, ``opefo-preflight``."""
