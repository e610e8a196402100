"""A reward of the user's own, named ``package.module:callable``: imported once per process, called
as ``function(response, ground_truth)``, its return read as a score and optional extra metrics
(docs/rewards_data_eval.md, "A reward function of your own").
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import traceback
from collections.abc import Callable, Mapping
from numbers import Real
from types import ModuleType

RewardFunction = Callable[[str, str], object]


class RewardFunctionError(ValueError):
    """The reward function's name does not lead to a callable taking (response, ground_truth):
    a set-up problem, reported in one line naming the key."""


def split_name(name: str) -> tuple[str, str] | None:
    """``(module, attribute)`` of ``package.module:callable``; None when it is not of that form."""
    module, sep, attribute = name.partition(":")
    if not sep or not module or not attribute.isidentifier():
        return None
    if not all(part.isidentifier() for part in module.split(".")):
        return None
    return module, attribute


def _raised_where(error: BaseException) -> str:
    """``ExcType: message (file:line)`` of where ``error`` was raised, on one line."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}{where}"


def _import_module(module: str, key: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except Exception as error:
        missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
        if missing is not None and (module + ".").startswith(missing + "."):
            problem = f"no module named {missing!r} (put the directory that holds it on PYTHONPATH)"
        else:  # the module is there; running it failed
            problem = f"importing {module} raised {_raised_where(error)}"
        raise RewardFunctionError(f"{key}={name}: {problem}") from None


@functools.cache
def load_reward_function(name: str, key: str = "reward.function") -> RewardFunction:
    """The callable ``name`` (``package.module:callable``) names, imported once per process;
    raises :class:`RewardFunctionError` naming ``key`` when the name is malformed, the module or
    the attribute is missing, importing the module fails, or the callable cannot be called with
    two positional arguments."""
    parts = split_name(name)
    if parts is None:
        raise RewardFunctionError(f"{key}={name} is not of the form package.module:callable")
    module_name, attribute = parts
    module = _import_module(module_name, key, name)
    function = getattr(module, attribute, None)
    if function is None:
        raise RewardFunctionError(f"{key}={name}: module {module_name} has no {attribute!r}")
    if not callable(function):
        raise RewardFunctionError(
            f"{key}={name}: {attribute} is not callable (it is of type {type(function).__name__})"
        )
    try:
        inspect.signature(function).bind("response", "ground truth")
    except TypeError as error:
        raise RewardFunctionError(
            f"{key}={name}: it is called as {attribute}(response, ground_truth), but {error}"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): the first call will tell
        pass
    return function


def _number(value: object, what: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, Real):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {number}")
    return number


def read_reward(value: object) -> tuple[float, dict[str, float]]:
    """``(score, metrics)`` of a reward function's return: a number (a bool counts as 1 / 0), or
    a mapping with a number under ``"score"`` and a number under every other key (the extra
    metrics). Raises ``TypeError`` / ``ValueError`` on anything else or a non-finite number."""
    if not isinstance(value, Mapping):
        return _number(value, "the returned score"), {}
    if "score" not in value:
        raise ValueError(f"the returned mapping has no 'score' (keys: {sorted(value)})")
    metrics = {
        str(name): _number(item, f"metric {name!r}")
        for name, item in value.items()
        if name != "score"
    }
    return _number(value["score"], "'score'"), metrics
