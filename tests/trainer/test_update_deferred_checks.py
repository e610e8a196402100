"""The engines' checks, deferred to the end of each pass (docs/performance.md): the error names
its micro-batch and is raised once; non-finite logits in the loss pass skip the step."""

from __future__ import annotations

import json

import pytest

from opefo_nemo.models.tiny import build_tiny_model
from tests.trainer.workers_deferred_checks import (
    check_nonfinite_logits,
    megatron_rank,
    nan_embedding_row,
)
from tests.trainer.workers_host_syncs import MICRO_BATCH_SIZE, SPEC

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("checks") / "model", SPEC, seed=0)


def test_hf_nonfinite_logits_in_one_micro_batch(model_dir):
    from opefo_nemo.config.engines import EngineConfig
    from opefo_nemo.engines.hf import HFPolicy

    engine = EngineConfig(device="cpu", micro_batch_size=MICRO_BATCH_SIZE)
    policy = HFPolicy(model_dir, engine, lr=1e-3, temperature=1.0)
    nan_embedding_row(policy.model.get_input_embeddings().weight, 2)
    check_nonfinite_logits(policy, 2)


def test_megatron_bad_target_and_nonfinite_logits_in_one_micro_batch(model_dir):
    pytest.importorskip("megatron.core")
    from tests.parallel.world import run_world

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    run_world(megatron_rank, 1, str(model_dir), vocab)
