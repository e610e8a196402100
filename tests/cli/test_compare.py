"""``opefo-eval compare`` on tiny models: a model against an exact copy of itself draws the same
samples (the same prompts, sampling and row seeds), so every Δ(k) and its interval are 0 and no
problem is solved by one only; a run directory is compared checkpoint by checkpoint; the report's
numbers are those of the counts files; bad input stops with one line naming the option."""

from __future__ import annotations

import json
import shutil

import pytest

from opefo_nemo.cli import eval as eval_cli
from opefo_nemo.config.compose import compose
from opefo_nemo.eval.counts import read_counts
from opefo_nemo.trainer.setup import generated_split

N, NEW_TOKENS = 4, 24


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    """Four arithmetic problems in our schema, each with a calibration count."""
    data = compose(["data.arithmetic.num_validation=4"])[0].data
    path = tmp_path_factory.mktemp("heldout") / "heldout.jsonl"
    rows = [
        {"id": p.prompt_id, "problem": p.problem, "answer": p.ground_truth, "source": p.source,
         "calibration": {"correct": i + 1, "samples": 16}}
        for i, p in enumerate(generated_split("arithmetic", data)[1])
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def command(base, models, heldout, out, *extra: str) -> list[str]:
    return [
        "compare", str(base), *map(str, models), "--heldout", str(heldout),
        "--verifier", "arithmetic", "--samples", str(N), "--max-new-tokens", str(NEW_TOKENS),
        "--dtype", "float32", "--generator", "hf", "--resamples", "200", "--out", str(out),
        *extra,
    ]  # fmt: skip


def a_run(tmp_path, model):
    """A run's output directory whose one checkpoint holds ``model``."""
    step = tmp_path / "run" / "checkpoints" / "step_000010"
    shutil.copytree(model, step / "policy" / "model")
    (step / "trainer_state.json").write_text("{}")
    return tmp_path / "run"


@pytest.fixture(scope="module")
def compared(demo_model, warm_model, heldout, tmp_path_factory):
    """The demo model against an exact copy of itself and against the other tiny model."""
    root = tmp_path_factory.mktemp("compare")
    copy = root / "copy"
    shutil.copytree(demo_model, copy)
    out = root / "out"
    argv = command(demo_model, [copy, a_run(root, warm_model)], heldout, out, "--names",
                   "base,copy,other")  # fmt: skip
    assert eval_cli.main(argv) == 0
    return out, json.loads((out / "boundary.json").read_text())


def test_a_copy_of_the_model_draws_the_same_samples(compared):
    out, report = compared
    assert report["ks"] == [1, 2]
    copy = next(pair for pair in report["comparisons"] if pair["b"] == "copy")
    for k in ("1", "2"):
        assert copy["delta"][k] == {"value": 0.0, "low": 0.0, "high": 0.0}
        assert report["models"]["copy"]["pass_at_k"][k] == report["models"]["base"]["pass_at_k"][k]
    assert copy["only_a"] == [] and copy["only_b"] == []
    base, same = (
        read_counts(out / "counts" / "base.jsonl"),
        read_counts(out / "counts" / "copy.jsonl"),
    )
    assert base[1] == same[1]  # answers, lengths and all
    assert base[0]["purpose"] == "compare" and base[0]["base_seed"] == same[0]["base_seed"]


def test_the_report_holds_the_counts_files_numbers(compared, heldout):
    out, report = compared
    assert list(report["models"]) == ["base", "copy", "other"]
    assert report["settings"]["models"]["other"].endswith("step_000010/policy/model")
    ids = [json.loads(line)["id"] for line in heldout.read_text().splitlines()]
    for label in ("base", "copy", "other"):
        _, counts = read_counts(out / "counts" / f"{label}.jsonl")
        assert [row["correct"][label] for row in report["per_problem"]] == [
            c.correct for c in counts
        ]
        assert [c.prompt_id for c in counts] == ids
    assert [row["calibration"] for row in report["per_problem"]] == [
        [1, 16],
        [2, 16],
        [3, 16],
        [4, 16],
    ]
    assert report["cost"]["base"]["samples"] == 4 * N
    assert (out / "boundary.png").read_bytes()[:4] == b"\x89PNG"
    assert "| other − base |" in (out / "boundary.md").read_text()


def test_a_run_directory_is_named_by_its_checkpoints(compared, demo_model, heldout, tmp_path):
    out, _ = compared
    again = tmp_path / "again"
    shutil.copytree(out, again)  # the counts are there: nothing is drawn, the names are new
    (again / "counts" / "base.jsonl").rename(again / "counts" / "tiny_arithmetic_orders.jsonl")
    (again / "counts" / "other.jsonl").rename(again / "counts" / "run_step_000010.jsonl")
    run = out.parent / "run"
    assert eval_cli.main(command(demo_model, [run], heldout, again, "--k-max", "1")) == 0
    report = json.loads((again / "boundary.json").read_text())
    assert list(report["models"]) == ["tiny_arithmetic_orders", "run/step_000010"]
    assert report["ks"] == [1] and report["cost"]["run/step_000010"]["samples"] == 0


def test_bad_input_stops_with_one_line_naming_the_option(demo_model, heldout, tmp_path, capsys):
    other = tmp_path / "other_tokenizer"
    shutil.copytree(demo_model, other)
    tokenizer = other / "tokenizer" / "tokenizer.json"
    spec = json.loads(tokenizer.read_text())
    vocab = spec["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    tokenizer.write_text(json.dumps(spec))
    out = tmp_path / "out"
    cases = {
        "--k-max 4: pass@4 needs --samples >= 8": [
            demo_model,
            [demo_model],
            heldout,
            ["--k-max", "4"],
        ],
        "other_tokenizer: its tokenizer differs from BASE's": [demo_model, [other], heldout, []],
        "data file not found": [demo_model, [demo_model], tmp_path / "none.jsonl", []],
        "--names a: need 2 distinct names": [demo_model, [demo_model], heldout, ["--names", "a"]],
        "does not exist": [demo_model, [tmp_path / "nothing"], heldout, []],
    }
    for expected, (base, models, path, extra) in cases.items():
        assert eval_cli.main(command(base, models, path, out, *extra)) == 2, expected
        err = capsys.readouterr().err
        assert err.startswith("opefo-eval compare: error:") and expected in err, err
        assert err.count("\n") == 1, err
    assert not (out / "counts").exists()  # nothing drawn
