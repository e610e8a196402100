"""What every command shares about its command line: argparse errors on one line (exit 2), the
config groups and their options for ``--help``, and Hydra's ``--cfg job`` (print the resolved
config) for the commands that take overrides.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from opefo_nemo.config import conf_dir

#: The config groups a run selects from, in the order ``--help`` lists them.
GROUPS = ("model", "data", "method", "engine", "rollout", "preset")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def config_choices() -> str:
    """``group: option, option, ...`` for each of :data:`GROUPS` (``preset`` with ``+``)."""
    root = conf_dir()
    lines = ["config groups (select with group=option; a preset with +preset=option):"]
    for group in GROUPS:
        names = sorted(p.stem for p in (root / group).glob("*.yaml") if not p.stem.startswith("_"))
        lines.append(f"  {group}: {', '.join(names)}")
    return "\n".join(lines)


def cfg_request(args: Sequence[str], prog: str) -> tuple[list[str], bool]:
    """``args`` less Hydra's ``--cfg job`` / ``--cfg=job``, and whether it was there; another
    ``--cfg`` value is an error (only the job's config is composed here)."""
    rest, wanted, items = [], False, list(args)
    while items:
        arg = items.pop(0)
        if arg == "--cfg" or arg.startswith("--cfg="):
            value = arg.split("=", 1)[1] if "=" in arg else (items.pop(0) if items else "")
            if value != "job":
                print(
                    f"{prog}: error: --cfg {value or '(nothing)'}: only `--cfg job` (the resolved "
                    "run config) is supported",
                    file=sys.stderr,
                )
                raise SystemExit(2)
            wanted = True
        else:
            rest.append(arg)
    return rest, wanted
