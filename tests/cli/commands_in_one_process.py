"""Run several command lines of the ``opefo-*`` commands in one Python process, each as its
console script runs it (``main(argv)``, its exit status from the return value or ``SystemExit``),
with what it writes to file descriptors 1 and 2 captured on its own, so log handlers and warnings
count too.

``python -m tests.cli.commands_in_one_process CASES.json RESULTS.json``: CASES holds
``[[command, [args...]], ...]`` (``command`` a module of ``opefo_nemo.cli``); RESULTS receives
``[{"code": int, "stdout": str, "stderr": str}, ...]`` in the same order. An exception that escapes
a command is written to its stderr as a traceback with code 1, as the interpreter would.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import traceback


def _run_one(command: str, args: list[str]) -> dict[str, object]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            code = importlib.import_module(f"opefo_nemo.cli.{command}").main(args)
        except SystemExit as stop:  # as the interpreter exits: a message goes to stderr, code 1
            code = stop.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except BaseException:  # reported as the interpreter reports it
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
        out.seek(0), err.seek(0)
        return {
            "code": int(code or 0),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def main(cases_path: str, results_path: str) -> None:
    with open(cases_path) as f:
        cases = json.load(f)
    results = [_run_one(command, list(args)) for command, args in cases]
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
