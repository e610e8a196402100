"""Start-up checks of a run's inputs, shared by ``opefo-train``, ``opefo-probe`` and
``opefo-preflight``: the model directory the model settings ask for, the data files, the reward
function (``reward.function``, imported here) and the run directory (``checkpoint.resume``). Each
problem raises an error whose one-line message names the key and the fix; nothing else is
built, loaded or written here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from opefo_nemo.config.data import GENERATED_DATA, WORD_TASK_KEYS
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.data import DatasetError
from opefo_nemo.models.directory import architecture_problem, model_files_problem
from opefo_nemo.rewards.function import RewardFunctionError, load_reward_function
from opefo_nemo.tasks.embedded_model import ModelPathError, holds_warm_start
from opefo_nemo.tasks.embedded_model import warm_start_recipe as recipe_of
from opefo_nemo.tasks.warm_start import read_recipe
from opefo_nemo.trainer.checkpoint import CHECKPOINTS_SUBDIR, ResumeError, resume_point

ARITHMETIC = "arithmetic"
#: What :func:`check_inputs` raises: the user's set-up, one line each.
INPUT_ERRORS = (
    FileNotFoundError,
    ModelPathError,
    DatasetError,
    RewardFunctionError,
    ResumeError,
)


def warm_start_recipe(config: TrainConfig) -> dict[str, Any]:
    """The recipe of the embedded model ``config`` describes (:mod:`..tasks.embedded_model`)."""
    data = config.data
    problems = dataclasses.asdict(data.arithmetic)
    for word_task_only in WORD_TASK_KEYS:  # at their defaults here (validated): the warm
        del problems[word_task_only]  # starts made before these keys keep their recipe
    return recipe_of(config.model.warm_start, data.template, problems)


def check_embedded_model(config: TrainConfig) -> None:
    """``model.embedded=true``: ``model.path`` is a default place or already holds the warm start
    these settings make (:func:`..tasks.embedded_model.holds_warm_start`, the check start-up
    builds by), never a model of the user's own (forgetting ``model=local``), and the task is
    arithmetic."""
    target = Path(config.model.path)
    if (target / "config.json").is_file() and read_recipe(target) is None:
        raise ModelPathError(
            f"model.path={target} is a Hugging Face model directory, not the embedded toy model: "
            "add `model=local` to train it"
        )
    if config.data.train != ARITHMETIC:
        raise ModelPathError(
            f"the embedded toy model trains on data=arithmetic, not data.train="
            f"{config.data.train}: add `model=local model.path=<Hugging Face model directory>` "
            "to train a model of your own on it"
        )
    holds_warm_start(target, warm_start_recipe(config))


def check_model(config: TrainConfig) -> None:
    """The model settings point at a model that exists (a packaged one is converted on use);
    a model of the user's own holds what the engines load (:mod:`..models.directory`)."""
    if config.model.embedded:
        check_embedded_model(config)
    elif config.model.packaged is None:
        path = Path(config.model.path)
        name = f"model.path={path}"
        problem = model_files_problem(path, name) or architecture_problem(path, name)
        if problem is not None:
            raise (FileNotFoundError if not path.exists() else ModelPathError)(problem)


def check_data(config: TrainConfig) -> None:
    """``data.train`` and ``data.validation`` name a built-in task or an existing file."""
    for key, source in (
        ("data.train", config.data.train),
        ("data.validation", config.data.validation),
    ):
        if source is None and key == "data.validation":
            continue
        if not source:
            tasks = ", ".join(GENERATED_DATA)
            raise DatasetError(f"{key} is empty: give a .jsonl / .parquet file or one of {tasks}")
        if source not in GENERATED_DATA and not Path(source).is_file():
            raise FileNotFoundError(f"{key}={source}: no such file")


def check_reward_function(config: TrainConfig) -> None:
    """``reward.function`` imports and names a callable of (response, ground_truth)."""
    if config.reward.function is not None:
        load_reward_function(config.reward.function)


#: Settings a continued run must share with the run it continues (others, e.g. the step count,
#: may change).
RUN_IDENTITY = (("method", "name"), ("model", "path"), ("data", "train"))


def check_run_directory(config: TrainConfig, output_dir: Path) -> None:
    """``checkpoint.resume`` against ``output_dir`` (:func:`.checkpoint.resume_point`); a run
    that would continue the directory's own checkpoint must be the same run: the same method,
    model and training data as the checkpoint's ``config.yaml``."""
    found = resume_point(config.checkpoint.resume, output_dir)
    if found is None or found.parent != output_dir / CHECKPOINTS_SUBDIR:
        return
    recorded = yaml.safe_load((found / "config.yaml").read_text()) or {}
    for section, key in RUN_IDENTITY:
        was = (recorded.get(section) or {}).get(key)
        now = getattr(getattr(config, section), key)
        if was is not None and str(was) != str(now):
            raise ResumeError(
                f"run.output_dir={output_dir} holds a run with {section}.{key}={was}, not {now}: "
                "give this run its own run.output_dir"
            )


def check_inputs(config: TrainConfig, output_dir: Path) -> None:
    """Every check above, then the run directory against ``checkpoint.resume``."""
    check_model(config)
    check_data(config)
    check_reward_function(config)
    check_run_directory(config, output_dir)
