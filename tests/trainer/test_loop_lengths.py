"""What a run directory records of its batches' layout (docs/batch_layout.md): ``lengths.jsonl``
holds each update's rows as generated (prompt and response tokens, in the batch's order), and
the ``perf/*`` metrics of ``metrics.jsonl`` are the planner's on those lengths with the model's
attention width. The ``hf`` engine samples (``rollout=engine``) from the shipped demo model."""

from __future__ import annotations

import json

from opefo_nemo.config.compose import compose
from opefo_nemo.engines.batch_layout import plan_layouts
from opefo_nemo.models.shape import ModelShape
from opefo_nemo.trainer.metrics_log import read_metrics
from opefo_nemo.trainer.setup import build_trainer
from opefo_nemo.trainer.update_layout import layout_metrics


def test_lengths_jsonl_records_the_generated_rows_and_perf_follows_them(demo_model, tmp_path):
    out = tmp_path / "run"
    config, config_dict = compose(
        [
            f"model.path={demo_model}",
            f"run.output_dir={out}",
            "trainer.prompts_per_step=4",
            "trainer.responses_per_prompt=4",
            "trainer.max_steps=2",
            "rollout=engine",
            "engine.micro_batch_size=16",  # one generation chunk
            "engine.max_tokens_per_micro_batch=60",
            "metrics.progress=false",
            "metrics.tensorboard=false",
            "checkpoint.every=0",
        ]
    )
    trainer = build_trainer(config, config_dict, out)
    generated = []
    generate = trainer.rollout.generate

    def recorded(prompts, k, sampling):
        completions = generate(prompts, k, sampling)
        generated.append(
            (
                [len(prompts[c.prompt_index]) for c in completions],
                [len(c.token_ids) for c in completions],
            )
        )
        return completions

    trainer.rollout.generate = recorded
    assert trainer.run() == "done"
    assert trainer.attention_width == ModelShape.from_model_dir(demo_model).attention_width()
    lines = (out / "lengths.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2]
    assert [(r["prompt_tokens"], r["response_tokens"]) for r in records] == generated
    assert len({n for r in records for n in r["response_tokens"]}) > 1  # lengths that differ
    for record, metrics in zip(records, read_metrics(out / "metrics.jsonl"), strict=True):
        rows = zip(record["prompt_tokens"], record["response_tokens"], strict=True)
        lengths = [p + r for p, r in rows]
        layouts = plan_layouts(
            lengths, micro_batch_size=16, max_tokens=60, attention_width=trainer.attention_width
        )
        expected = layout_metrics(layouts, lengths, 1, trainer.attention_width)
        assert {k: metrics[k] for k in expected} == expected
