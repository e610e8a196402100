"""``opefo-report``: the files it writes, what it logs, and its errors (exit status 2)."""

from __future__ import annotations

import subprocess
import sys

import matplotlib.image
import pytest

from opefo_nemo.cli import report as report_cli
from tests.report.run_dirs import PANEL_KEYS, records, run_config, write_run


def runs(tmp_path, drop=()):
    dirs = []
    for method, seed in (("grpo_strict", 0), ("grpo_strict", 1), ("opefo", 0)):
        path = tmp_path / method / f"seed_{seed}"
        keys = [k for k in PANEL_KEYS if (method, seed, k) not in drop]
        metrics = records(range(1, 13), lambda k, s: 0.1 * s, keys)
        write_run(path, metrics, run_config(method, seed, path))
        dirs.append(str(path))
    return dirs


def test_writes_png_and_table_and_logs_what_it_read(tmp_path, capsys, caplog):
    caplog.set_level("INFO")
    dirs = runs(tmp_path, drop={("opefo", 0, "flow/net_after_balance")})
    out = tmp_path / "report"
    assert report_cli.main([*dirs, "--out", str(out), "--smooth", "3"]) == 0
    png = out / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(png).shape
    assert (width, height) == (1840, 1690)  # 4 rows of 4 panels, the last row half empty
    table = (out / "summary.md").read_text()
    assert "| grpo_strict | 0, 1 | 12 |" in table and "| opefo | 0 | 12 |" in table
    assert "no `flow/net_after_balance`" in table
    assert capsys.readouterr().out.split() == [str(png), str(out / "summary.md")]
    log = caplog.text
    assert f"read {dirs[2]}: 12 steps (opefo seed 0)" in log
    assert "group grpo_strict: 2 run(s), seeds [0, 1]" in log
    assert f"{dirs[2]} logged no flow/net_after_balance" in log


def test_a_directory_without_metrics_is_exit_2_naming_it(tmp_path):
    dirs = runs(tmp_path)
    (tmp_path / "not_a_run").mkdir()
    out = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "opefo_nemo.cli.report",
            *dirs,
            str(tmp_path / "not_a_run"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"opefo-report: error: {tmp_path / 'not_a_run'} holds no metrics.jsonl: "
        "not a run directory of opefo-train"
    )
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_a_directory_given_twice_and_bad_options_are_exit_2(tmp_path, capsys):
    dirs = runs(tmp_path)
    assert report_cli.main([dirs[0], dirs[0] + "/", "--out", str(tmp_path / "o")]) == 2
    assert "given twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        report_cli.main([dirs[0], "--out", str(tmp_path / "o"), "--smooth", "0"])
    assert stop.value.code == 2
    with pytest.raises(SystemExit) as stop:
        report_cli.main([dirs[0]])  # --out is required
    assert stop.value.code == 2
