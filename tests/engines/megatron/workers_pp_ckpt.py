"""Rank function for the pipeline-parallel checkpoint tests, and the cached world run they share.

One spawned 2-rank gloo world, real megatron-core ``GPTModel``\\ s of the tiny Qwen2 (untied and
tied embeddings), records per check the names that failed:

1. PP 2 (TP 1, DP 1): each stage loads its Hugging Face weights (``hf_to_megatron``) into a model
   in megatron's ``DistributedDataParallel`` with megatron's optimizer
   (:func:`~.workers_ckpt.megatron_trainer`), which takes one step on gradients drawn per
   *global* weight name into ``main_grad`` (the tied copy on the last stage gets the embedding's,
   as after the embedding-group sum), the weights are put back to the Hugging Face ones (so that
   an export must equal the original model) and :func:`save_megatron` writes ``pp2_<family>``.
   A fresh PP-2 model (megatron's random init) and a fresh optimizer load it: weights, AdamW
   state and lr bit-equal to the saved ones on every stage. Mismatched models are
   refused on *both* ranks, each naming the key, although only one stage sees the problem:
   the tied checkpoint into the untied model (the last stage misses ``output_layer.weight``),
   the untied checkpoint into the tied model (no stage wants ``output_layer.weight``).
2. PP 1 × DP 2: the PP-2 checkpoints load into unsplit models; every weight and AdamW state equals
   the PP-2 stages' saved tensors under their global layer index.

The export of ``pp2_<family>`` is checked in the test process (``test_checkpoint_pipeline``).
"""

from __future__ import annotations

import json
import re
import warnings
import zlib
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.checkpoint import load_megatron, save_megatron
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.models.megatron_weights import MegatronLayout, hf_to_megatron
from tests.parallel.world import run_world

from .tiny import hf_model, hf_weights, layout, megatron_gpt, release_parallel_state
from .workers_ckpt import checkpoint_on_cpu, differences, megatron_trainer, snapshot

FAMILIES = ("qwen2", "qwen2_tied")
EMBEDDING = "embedding.word_embeddings.weight"
_CACHE: dict[str, Path] = {}


def world_results(root: Path) -> Path:
    """Run the world once per test session under ``root``; returns ``root``, holding
    ``results.json``, the checkpoints ``pp2_<family>`` and the originals ``hf_<family>/``."""
    if "root" not in _CACHE:
        shards = {}
        for family in FAMILIES:
            model = hf_model(family, seed=5)
            model.save_pretrained(root / f"hf_{family}")
            shards[family] = hf_to_megatron(layout(family, pp=2), hf_weights(model))
        run_world(pp_checkpoint_world, 2, shards, str(root))
        _CACHE["root"] = root
    return _CACHE["root"]


def global_name(name: str, first_layer: int) -> str:
    """A stage-local weight name with its decoder layer index made global."""
    return re.sub(
        r"^decoder\.layers\.(\d+)\.",
        lambda match: f"decoder.layers.{int(match[1]) + first_layer}.",
        name,
    )


def _stage_model(lay: MegatronLayout):
    """``(this stage's GPTModel of lay, the stage's first global layer index)``."""
    from megatron.core import parallel_state

    stage = parallel_state.get_pipeline_model_parallel_rank()
    return megatron_gpt(lay, stage), lay.stage_layers(stage).start


def pp_checkpoint_world(rank: int, world_size: int, shards, root: str) -> None:
    """The module docstring's two parts; rank 0 writes ``results.json``."""
    warnings.filterwarnings("ignore")
    out = Path(root)
    results: dict[str, list[str]] = {}
    with megatron_on_cpu():
        compat.initialize_model_parallel(1, 2, gloo_groups=True)
        try:
            saved = {
                family: _save_and_resume_pp2(family, shards, out, results) for family in FAMILIES
            }
            _refusals(out, results)
        finally:
            release_parallel_state()
        compat.initialize_model_parallel(1, 1, gloo_groups=True)
        try:
            for family in FAMILIES:
                _load_at_pp1(family, saved[family], out, results)
        finally:
            release_parallel_state()
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1))


def _save_and_resume_pp2(family: str, shards, out: Path, results: dict) -> dict:
    """Part 1 for ``family``; returns the saved snapshot of every stage (global names)."""
    from megatron.core import parallel_state

    lay = layout(family, pp=2)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    model, first_layer = _stage_model(lay)
    extra = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
    hf_state = {**extra, **shards[family][(stage, 0)]}
    model.load_state_dict(hf_state, strict=True)
    _, optimizer = megatron_trainer(model)
    for name, param in model.named_parameters():
        drawn = (
            EMBEDDING if name == "output_layer.weight" and lay.shape.tie_word_embeddings else name
        )
        seed = zlib.crc32(global_name(drawn, first_layer).encode())
        param.main_grad.copy_(
            torch.randn(param.shape, generator=torch.Generator().manual_seed(seed))
        )
    optimizer.step()
    with torch.no_grad():
        model.load_state_dict(hf_state, strict=True)
    with checkpoint_on_cpu():
        save_megatron(out / f"pp2_{family}", model, optimizer, {"family": family})
    saved = snapshot(model, optimizer, lambda n: global_name(n, first_layer))

    fresh, _ = _stage_model(lay)
    _, fresh_optimizer = megatron_trainer(fresh)
    results[f"pp2_fresh_differs_{family}"] = differences(
        saved, snapshot(fresh, fresh_optimizer, lambda n: global_name(n, first_layer))
    )
    loaded_extra = load_megatron(out / f"pp2_{family}", fresh, fresh_optimizer)
    results[f"pp2_to_pp2_{family}"] = differences(
        saved, snapshot(fresh, fresh_optimizer, lambda n: global_name(n, first_layer))
    )
    results[f"pp2_extra_{family}"] = (
        [] if loaded_extra == {"family": family} else [json.dumps(loaded_extra)]
    )
    stages: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(stages, saved)
    return {key: value for stage_snapshot in stages for key, value in stage_snapshot.items()}


def _refused(directory: Path, family: str) -> str:
    """The error of loading ``directory`` into a PP-2 model of ``family`` (``"no error"``)."""
    model, _ = _stage_model(layout(family, pp=2))
    _, optimizer = megatron_trainer(model)
    try:
        load_megatron(directory, model, optimizer)
    except ValueError as error:
        return str(error)
    return "no error"


def _refusals(out: Path, results: dict) -> None:
    """Part 1's refusals; every rank's message is recorded."""
    for name, directory, family in (
        ("refuse_tied_into_untied", out / "pp2_qwen2_tied", "qwen2"),
        ("refuse_untied_into_tied", out / "pp2_qwen2", "qwen2_tied"),
    ):
        messages: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(messages, _refused(directory, family))
        results[name] = messages


def _load_at_pp1(family: str, saved_full: dict, out: Path, results: dict) -> None:
    """Part 2 for ``family`` (the tied copy on the last stage has no PP-1 counterpart)."""
    model = megatron_gpt(layout(family))
    _, optimizer = megatron_trainer(model)
    load_megatron(out / f"pp2_{family}", model, optimizer)
    expected = {k: v for k, v in saved_full.items() if not k.endswith(":output_layer.weight")}
    if not layout(family).shape.tie_word_embeddings:
        expected = saved_full
    loaded = snapshot(model, optimizer, lambda n: global_name(n, 0))
    results[f"pp2_to_pp1_{family}"] = differences(expected, loaded)
