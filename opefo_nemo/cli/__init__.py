"""Command-line entry points, Hydra/argparse wiring only (docs/architecture.md): ``opefo-train``,
``opefo-eval``, ``opefo-preflight``, ``opefo-node-check``, ``opefo-export``."""
