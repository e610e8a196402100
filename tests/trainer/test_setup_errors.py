"""Errors are never silent: bad paths, empty data, long prompts, failing rewards (no vLLM)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opefo_nemo.config.compose import compose
from opefo_nemo.data import DatasetError
from opefo_nemo.data.prompt_codec import PromptCodec, encode_problems
from opefo_nemo.engines.aligner import AlignerUnavailableError
from opefo_nemo.engines.startup import DeviceUnavailableError
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.tasks.arithmetic import make_problems
from opefo_nemo.tasks.warm_start import read_recipe
from opefo_nemo.trainer.inputs import warm_start_recipe
from opefo_nemo.trainer.sampler import PromptSampler
from opefo_nemo.trainer.scoring import reason_metrics, score_responses
from opefo_nemo.trainer.setup import build_trainer, embedded_model, load_datasets


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelSpec(), seed=0)


@pytest.fixture(scope="module")
def preset_data(tmp_path_factory) -> str:
    """An existing training file for the presets (whose DAPO file lives on a cluster), so that
    the error a test expects is the first one start-up meets."""
    path = tmp_path_factory.mktemp("d") / "train.jsonl"
    path.write_text('{"problem": "3+4=", "answer": "7"}\n')
    return f"data.train={path}"


def test_missing_model_path_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "no_model"
    config, data = compose(["model=local", f"model.path={missing}"])
    with pytest.raises(FileNotFoundError, match=r"model\.path=.*no_model"):
        build_trainer(config, data, tmp_path / "out")


def test_the_aligner_engine_stops_with_a_clear_message(tiny, preset_data, tmp_path):
    """engine=aligner on a preset: the NeMo actor needs the NeMo container."""
    overrides = ["+preset=opefo_7b", "engine=aligner", f"model.path={tiny}", preset_data]
    config, data = compose(overrides)
    assert config.engine.name == "aligner"
    with pytest.raises(AlignerUnavailableError, match=r"engine\.name=aligner: this environment"):
        build_trainer(config, data, tmp_path / "out")


def test_the_megatron_engine_on_cuda_without_a_gpu_says_so(tiny, preset_data, tmp_path):
    """The presets train on GPU ranks: without one the error names engine.device."""
    config, data = compose(["+preset=opefo_7b", f"model.path={tiny}", preset_data])
    assert config.engine.name == "megatron" and config.engine.device == "cuda"
    with pytest.raises(DeviceUnavailableError, match=r"engine\.device=cuda but this rank sees no"):
        build_trainer(config, data, tmp_path / "out")


def test_torchrun_without_a_gpu_stops_every_rank_with_one_line(tiny, preset_data, tmp_path):
    """``torchrun … opefo-train`` with the presets' ``engine.device=cuda`` on a machine without a
    GPU: each rank prints the one-line start-up error and exits with 2; no frame of the trainer's
    code is printed (torchrun then prints its own summary of the failed ranks)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *("-m", "opefo_nemo.cli.train", "+preset=opefo_7b", f"model.path={tiny}"),
        f"run.output_dir={tmp_path / 'out'}",
        preset_data,
    ]
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode != 0
    assert "opefo-train: error: engine.device=cuda but this rank sees no GPU" in done.stderr
    assert "exitcode  : 2" in done.stderr, done.stderr[-2000:]  # torchrun's report of the rank
    frames = [line for line in done.stderr.splitlines() if line.lstrip().startswith("File ")]
    assert not [line for line in frames if "opefo_nemo" in line], frames


def test_missing_data_file_is_an_error_naming_it(tiny, tmp_path):
    config, _ = compose([f"model.path={tiny}", f"data.train={tmp_path / 'absent.jsonl'}"])
    with pytest.raises((FileNotFoundError, DatasetError), match=r"absent\.jsonl"):
        load_datasets(config, PromptCodec(tiny, "raw"))


def test_empty_dataset_is_an_error(tiny, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    config, _ = compose([f"model.path={tiny}", f"data.train={empty}", "data.validation=null"])
    with pytest.raises(ValueError, match="empty"):
        load_datasets(config, PromptCodec(tiny, "raw"))


def test_long_prompts_are_skipped_and_counted_or_refused(tiny):
    codec = PromptCodec(tiny, "raw")
    problems = make_problems(1, 50, 0, 0)[0] + make_problems(2, 50, 0, 0)[0]
    lengths = [len(codec.encode(p)) for p in problems]
    limit = 5  # <bos> + "a+b=": 5 tokens for one-digit operands, 7 for two
    expected_long = sum(n > limit for n in lengths)
    assert 0 < expected_long < len(problems)
    kept = encode_problems(problems, codec, limit, "skip", "data.train")
    assert kept.skipped_long == expected_long
    assert len(kept.problems) == len(problems) - expected_long
    assert all(len(p) <= limit for p in kept.prompts)
    with pytest.raises(ValueError, match=r"data\.max_prompt_tokens=5"):
        encode_problems(problems, codec, limit, "error", "data.train")
    with pytest.raises(ValueError, match="no usable problem"):
        encode_problems(problems, codec, 2, "skip", "data.train")


def test_a_failing_reward_item_scores_zero_and_is_counted():
    config, _ = compose([])
    results = score_responses(["=7", "=7", "x"], ["7", "not-a-number", "7"], config.reward)
    assert [r.score for r in results] == [1.0, 0.0, 0.0]
    assert [r.reason for r in results] == ["correct", "error", "no_answer"]
    metrics = reason_metrics(results)
    assert metrics["reward/failed"] == 1.0
    assert metrics["reward/correct_frac"] == pytest.approx(1 / 3)


def test_prompt_sampler_covers_each_epoch_and_resumes_exactly():
    sampler = PromptSampler(10, 4, seed=3)
    first = [sampler.next_batch() for _ in range(5)]  # 20 draws = two full epochs
    flat = [i for batch in first for i in batch]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]
    replay = PromptSampler(10, 4, seed=3)
    replay.next_batch()
    state = replay.state_dict()
    resumed = PromptSampler(10, 4, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(4)] == first[1:]
    with pytest.raises(ValueError, match="10 problems, this run has 11"):
        PromptSampler(11, 4, seed=3).load_state_dict(state)


def test_a_cached_warm_start_is_reused_rebuilt_or_refused_by_its_recipe(tmp_path, monkeypatch):
    """Same recipe: reused. Another recipe in the default place (a stale cache, e.g. of an older
    task): rebuilt with the new one. Another recipe elsewhere: refused."""
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path))
    path = tmp_path / "tiny_arithmetic"  # the default place under this OPEFO_CACHE
    small = ["model=tiny_arithmetic", "model.warm_start.steps=2", "model.warm_start.batch_size=4"]
    config, _ = compose(small)
    assert Path(config.model.path) == path
    assert embedded_model(config) == path
    weights = (path / "model.safetensors").read_bytes()
    assert embedded_model(config) == path  # same recipe: reused
    assert (path / "model.safetensors").read_bytes() == weights
    other, _ = compose([*small[:2], "model.warm_start.batch_size=5"])
    assert embedded_model(other) == path
    assert read_recipe(path) == warm_start_recipe(other)
    assert (path / "model.safetensors").read_bytes() != weights
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with pytest.raises(ValueError, match=r"model\.path=.*warm start made with"):
        embedded_model(compose([*small, f"model.path={copy}"])[0])


def test_each_embedded_task_is_built_into_its_own_place(tmp_path, monkeypatch):
    """The orders and shortcut tasks' warm starts go to their own directories under the cache,
    with their recipes; the first task's cache beside them is left as it is."""
    monkeypatch.setenv("OPEFO_CACHE", str(tmp_path))
    small = ["model.warm_start.steps=2", "model.warm_start.batch_size=4"]
    first = embedded_model(compose(["model=tiny_arithmetic", *small])[0])
    weights = (first / "model.safetensors").read_bytes()
    orders, _ = compose(["model=tiny_arithmetic_orders", *small])
    path = embedded_model(orders)
    assert path == tmp_path / "tiny_arithmetic_orders" != first
    recipe = read_recipe(path)
    assert recipe == warm_start_recipe(orders)
    assert (recipe["slips"], recipe["swap_rate"]) == ([-1], orders.model.warm_start.swap_rate)
    assert recipe["swap_rate"] > 0 and recipe["carry_first_rate"] > 0
    assert read_recipe(first)["swap_rate"] == 0
    assert (first / "model.safetensors").read_bytes() == weights
    shortcut, _ = compose(["model=tiny_shortcut", *small])
    assert embedded_model(shortcut) == tmp_path / "tiny_shortcut"
    recipe = read_recipe(tmp_path / "tiny_shortcut")
    assert recipe["shortcut_rate"] == shortcut.model.warm_start.shortcut_rate > 0
    assert "shortcut_rate" not in read_recipe(first)


def test_the_warm_start_is_deterministic(tmp_path, monkeypatch):
    """Two builds of the same recipe in two caches give bit-identical weights."""
    small = ["model=tiny_arithmetic", "model.warm_start.steps=3", "model.warm_start.batch_size=8"]
    weights = []
    for cache in ("a", "b"):
        monkeypatch.setenv("OPEFO_CACHE", str(tmp_path / cache))
        path = embedded_model(compose(small)[0])
        weights.append((path / "model.safetensors").read_bytes())
    assert weights[0] == weights[1]


def test_opefo_eval_finds_the_model_inside_a_checkpoint(tmp_path):
    from opefo_nemo.cli.eval import resolve_model

    model = tmp_path / "ckpt" / "step_000010" / "policy" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert resolve_model(tmp_path / "ckpt" / "step_000010") == model
    assert resolve_model(model.parent) == model
    assert resolve_model(model) == model
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        resolve_model(tmp_path / "ckpt")


def test_opefo_eval_rejects_bad_input_before_starting_vllm(tiny, tmp_path, capsys):
    import json

    from opefo_nemo.cli import eval as eval_cli

    bench = tmp_path / "arith.jsonl"
    bench.write_text(json.dumps({"problem": "3+4=", "answer": "7"}) + "\n")
    positions = json.loads((tiny / "config.json").read_text())["max_position_embeddings"]
    common = ["--file", f"arith={bench}", "--verifier", "arithmetic", "--out", str(tmp_path / "o")]
    cases = {
        "does not exist": [str(tmp_path / "no_ckpt"), *common],
        f"max_position_embeddings {positions}": [
            str(tiny),
            *common,
            "--max-model-len",
            str(positions + 1),
        ],
        "plus --max-new-tokens": [
            str(tiny),
            *common,
            "--max-model-len",
            str(positions),
            "--max-new-tokens",
            str(positions),
        ],
        "data file not found": [str(tiny), "--file", f"arith={tmp_path / 'none.jsonl'}"],
    }
    for expected, argv in cases.items():
        assert eval_cli.main(argv) == 2, expected
        err = capsys.readouterr().err
        assert err.startswith("opefo-eval: error:") and expected in err, err
    with pytest.raises(SystemExit):
        eval_cli.parse_args([str(tiny), "--verifier", "exact"])
    assert "invalid choice: 'exact'" in capsys.readouterr().err


def test_opefo_train_prints_a_bad_override_as_one_line(capsys):
    from opefo_nemo.cli import train as train_cli

    assert train_cli.main(["trainer.max_stepz=5"]) == 2
    err = capsys.readouterr().err
    assert "unknown key trainer.max_stepz" in err and "Traceback" not in err
    assert train_cli.main(["method=opefoo"]) == 2
    err = capsys.readouterr().err
    assert "method/opefoo" in err and "grpo_strict, incorrect_only, kl_cov" in err
    assert "_defaults" not in err and "Config search path" not in err
    assert train_cli.main(["method.lr=-1"]) == 2
    assert "method.lr must be > 0" in capsys.readouterr().err


def test_opefo_train_prints_a_start_up_problem_as_one_line(capsys, tmp_path):
    from opefo_nemo.cli import train as train_cli

    missing = tmp_path / "no_model"
    assert train_cli.main(["model=local", f"model.path={missing}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opefo-train: error: ") and "no_model" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_missing_model_path_never_becomes_the_toy_model(tmp_path):
    """``model.path`` set without ``model=local`` keeps the embedded model group: a path that does
    not exist is an error naming ``model=local``, and nothing is built there."""
    typo = tmp_path / "Qwen2.5-Math-7B-typo"
    config, data = compose([f"model.path={typo}"])
    assert config.model.embedded
    with pytest.raises(FileNotFoundError, match=r"model=local model\.path="):
        build_trainer(config, data, tmp_path / "out")
    assert not typo.exists() and not typo.parent.joinpath(f"{typo.name}.base").exists()
