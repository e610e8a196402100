"""Command-line entry points: Hydra/argparse wiring only (see ARCHITECTURE.md)."""
