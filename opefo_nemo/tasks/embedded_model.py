"""The embedded toy models: a tiny Qwen2 warm-started on the arithmetic task, built on first use
into ``$OPEFO_CACHE/<name>`` and reused after, the recipe that made it stored beside it
(docs/training.md, "The embedded default")."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from opefo_nemo.data import Problem
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.tasks.arithmetic import operands, worked_solution
from opefo_nemo.tasks.shortcut import shortcut_answer
from opefo_nemo.tasks.warm_start import WarmStartConfig, read_recipe, supervised_warm_start

log = logging.getLogger(__name__)
TASK = "column addition with worked steps"
"""Names the embedded task in the warm-start recipe, so a cache of another task is rebuilt."""
EMBEDDED_MODELS = ("tiny_arithmetic", "tiny_arithmetic_orders", "tiny_shortcut")
"""The embedded models' directory names under the cache (``conf/model/<name>.yaml``)."""
SHIPPED = Path(__file__).parent / "shipped_warm_starts"
"""Warm starts shipped with the package, each in a directory named like its cache: the demo's
(``tiny_arithmetic_orders``), the weights the entropy-control study
(docs/studies/entropy_control.md) started from, and the first task's (``tiny_arithmetic``,
``+preset=tiny_cpu``'s model)."""


class PromptEncoder(Protocol):
    """What the warm start needs of a prompt codec (``data/prompt_codec.py`` ``PromptCodec``)."""

    tokenizer: Any

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    def encode(self, problem: Problem) -> list[int]: ...


class ModelPathError(ValueError):
    """``model.path`` does not hold what the model settings ask for."""


def embedded_paths() -> tuple[Path, ...]:
    """Where embedded models are built: ``$OPEFO_CACHE/<name>`` for each of
    :data:`EMBEDDED_MODELS`, ``OPEFO_CACHE`` defaulting to ``.cache/opefo``."""
    cache = Path(os.environ.get("OPEFO_CACHE", ".cache/opefo"))
    return tuple(cache / name for name in EMBEDDED_MODELS)


def is_embedded_default(path: Path) -> bool:
    """Whether ``path`` is one of :func:`embedded_paths` (the only places one is built)."""
    return path.resolve() in {default.resolve() for default in embedded_paths()}


def warm_start_recipe(
    warm_start: WarmStartConfig, template: str, problems: Mapping[str, Any]
) -> dict[str, Any]:
    """What an embedded model is made from: the task, every warm-start setting, the prompt
    template and the settings that draw the problems. The shortcut settings are recorded only
    when shortcuts are written, so the warm starts made without them keep their recipe (and
    their caches)."""
    settings = dataclasses.asdict(warm_start)
    if not warm_start.shortcut_rate:
        del settings["shortcut_rate"], settings["shortcut_slip_rate"]
    return {
        "task": TASK,
        **settings,
        "slips": list(warm_start.slips),
        "template": template,
        "arithmetic": dict(problems),
    }


def shipped_warm_start(name: str, recipe: Mapping[str, Any]) -> Path | None:
    """The warm start of the embedded model ``name`` shipped with the package, if it was made
    with ``recipe`` (else ``None``: another recipe is built)."""
    source = SHIPPED / name
    return source if read_recipe(source) == recipe else None


def warm_start_response(a: int, b: int, w: WarmStartConfig, rng: random.Random) -> str:
    """One supervised response to ``a + b`` as the warm-start settings ``w`` write it: a
    shortcut answer (:mod:`.shortcut`) with probability ``w.shortcut_rate``, else a worked
    solution with its slips and writing choices."""
    if w.shortcut_rate and rng.random() < w.shortcut_rate:
        return shortcut_answer(a, b, w.shortcut_slip_rate, rng, slips=w.slips)
    return worked_solution(
        a,
        b,
        w.slip_rate,
        rng,
        slips=w.slips,
        swap_rate=w.swap_rate,
        carry_first_rate=w.carry_first_rate,
        zero_carry_rate=w.zero_carry_rate,
        separators=w.separators,
        separator_rate=w.separator_rate,
    )


def embedded_model(
    target: Path,
    warm_start: WarmStartConfig,
    recipe: dict[str, Any],
    problems: Callable[[], Sequence[Problem]],
    encoder: Callable[[Path], PromptEncoder],
    use_shipped: bool = True,
) -> Path:
    """The warm-started tiny model at ``target`` (``model.path``), built on first use.

    It is built only into one of :func:`embedded_paths`: any other ``target`` must already hold
    it, so that a mistyped path of one's own model (``model.path=...`` without ``model=local``)
    is an error, not a toy model trained in its place. ``recipe`` (:func:`warm_start_recipe`) is
    stored with the model; a warm start in the default place made with another recipe (an older
    task, other settings) is a stale cache, replaced by a new build; anywhere else another recipe
    is an error rather than a silent reuse. A missing model whose recipe is that of a shipped
    warm start (:func:`shipped_warm_start`) is copied from it when ``use_shipped``; building
    draws the training ``problems()`` and encodes them with ``encoder(base model directory)``.
    """
    if holds_warm_start(target, recipe):
        return target
    if target.exists():
        log.warning("%s holds a warm start made with another recipe: rebuilding it", target)
        shutil.rmtree(target)
    shipped = shipped_warm_start(target.name, recipe) if use_shipped else None
    if shipped is not None:
        log.info("copying the warm start shipped with the package into %s", target)
        staging = target.parent / f".{target.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(shipped, staging)
        staging.rename(target)
        return target
    return _build(target, warm_start, recipe, list(problems()), encoder)


def holds_warm_start(target: Path, recipe: Mapping[str, Any]) -> bool:
    """Whether ``target`` already holds the warm start of ``recipe``; ``False`` where one is to
    be built (a missing default place, or a stale cache there). Refuses, in one line naming the
    fix, a missing place of the user's own, one holding anything else and one holding a warm
    start of another recipe: the start-up check of :func:`embedded_model`, which preflight runs
    too. Reads only."""
    is_default = is_embedded_default(target)
    if not target.exists():
        if is_default:
            return False
        raise FileNotFoundError(
            f"model.path={target} does not exist. To train a model of your own, select it with "
            "model=local model.path=<Hugging Face model directory>; the embedded toy models are "
            f"built only into {' or '.join(map(str, embedded_paths()))} (set OPEFO_CACHE to move "
            "them)"
        )
    found = read_recipe(target)
    if found is None:
        raise ModelPathError(
            f"model.path={target} holds no embedded warm start: point model.path at a new "
            "directory, or add `model=local` if it is a model of your own"
        )
    if found == recipe:
        return True
    if not is_default:
        raise ModelPathError(
            f"model.path={target} holds a warm start made with other model.warm_start or "
            "data settings: restore those, or leave model.path at its default (rebuilt there)"
        )
    return False


def _build(
    target: Path,
    w: WarmStartConfig,
    recipe: dict[str, Any],
    train: Sequence[Problem],
    encoder: Callable[[Path], PromptEncoder],
) -> Path:
    """A fresh tiny model beside ``target``, warm-started into it on responses to the ``train``
    problems written as ``w`` says (:func:`warm_start_response`)."""
    log.info("building the embedded tiny model and warm-starting it into %s", target)
    base = build_tiny_model(target.parent / f"{target.name}.base", TinyModelSpec(), w.seed)
    codec = encoder(base)
    prompts = [codec.encode(p) for p in train]

    def draw(rng: random.Random) -> tuple[list[int], list[int]]:
        index = rng.randrange(len(train))
        solution = warm_start_response(*operands(train[index].problem), w, rng)
        response = codec.tokenizer.encode(solution, add_special_tokens=False)
        return prompts[index], [*response, codec.eos_id]

    return supervised_warm_start(
        base,
        target,
        draw,
        steps=w.steps,
        lr=w.lr,
        seed=w.seed,
        pad_id=codec.pad_id,
        recipe=recipe,
        batch_size=w.batch_size,
    )
