"""No host synchronisation per micro-batch in either pass of the update, for either engine.

Each engine runs the token-stats pass and the loss pass (``prepare``, forward + backward per
micro-batch, the optimizer step) of one step on batches of 1 and of 4 micro-batches, while
:class:`tests.host_syncs.HostSyncCounter` counts every call that would make the host wait for a
GPU, by source line. A line counted at least once more per added micro-batch is a
synchronisation per micro-batch: the test fails and prints both lists. (A smaller difference is a
per-step branch that depends on the data, such as megatron-core 0.11 scaling the gradients only
when their norm exceeds the clipping threshold.) What stays is read once
per step (the deferred checks, the statistics copied to the host once, the gradient norm, the
metric sums, megatron-core's optimizer step). A CUDA count of the same passes:
``benchmarks/engine_passes.py --device cuda``.
"""

from __future__ import annotations

import collections
import json

import pytest

from opefo_nemo.models.tiny import build_tiny_model
from tests.host_syncs import report
from tests.trainer.workers_host_syncs import SPEC, count_passes, megatron_rank

pytest.importorskip("transformers")

COUNTS = (1, 4)
#: Synchronisations per micro-batch left in place, by the start of their source line, and why.
ALLOWED = {
    "transformers/masking_utils.py": (
        "transformers reads the padding mask in every forward to choose between a causal-only "
        "attention and a materialised mask (_ignore_causal_mask_sdpa); avoiding it means "
        "dropping the hf engine's attention mask or building transformers' mask ourselves, and "
        "either may change which attention kernel runs, so the logits' rounding"
    ),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("syncs") / "model", SPEC, seed=0)


def _sites(rows) -> collections.Counter:
    return collections.Counter({(kind, site): n for kind, site, n in rows})


def _allowed(site: str) -> bool:
    return site.split(":")[0] in ALLOWED


def _per_micro_batch(result: dict, engine: str) -> list[str]:
    """Every source line counted more often with more micro-batches, with both lists."""
    failures = []
    for name in ("stats", "loss"):
        one, many = _sites(result[COUNTS[0]][name]), _sites(result[COUNTS[-1]][name])
        print(report(f"{engine} {name} pass, {COUNTS[0]} micro-batch", one))
        print(report(f"{engine} {name} pass, {COUNTS[-1]} micro-batches", many))
        grown = {
            key: many[key] - one[key]
            for key in many
            if many[key] - one[key] >= COUNTS[-1] - COUNTS[0] and not _allowed(key[1])
        }
        failures += [
            f"{engine} {name} pass: {kind} at {site}: +{extra} for "
            f"{COUNTS[-1] - COUNTS[0]} more micro-batches"
            for (kind, site), extra in sorted(grown.items())
        ]
    return failures


def test_hf_passes_make_no_host_sync_per_micro_batch(model_dir):
    from opefo_nemo.config.engines import EngineConfig
    from opefo_nemo.config.method import load_method
    from opefo_nemo.engines.hf import HFPolicy
    from tests.trainer.workers_host_syncs import METHOD, MICRO_BATCH_SIZE

    engine = EngineConfig(device="cpu", micro_batch_size=MICRO_BATCH_SIZE)
    policy = HFPolicy(model_dir, engine, lr=load_method(METHOD).lr, temperature=1.0)
    result = count_passes(policy, COUNTS)
    failures = _per_micro_batch(result, "hf")
    assert not failures, "\n".join(failures)


def test_megatron_passes_make_no_host_sync_per_micro_batch(model_dir, tmp_path):
    pytest.importorskip("megatron.core")
    from tests.parallel.world import run_world

    out = tmp_path / "syncs.json"
    run_world(megatron_rank, 1, str(model_dir), COUNTS, str(out))
    result = {int(count): passes for count, passes in json.loads(out.read_text()).items()}
    failures = _per_micro_batch(result, "megatron")
    assert not failures, "\n".join(failures)
