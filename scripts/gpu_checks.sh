#!/usr/bin/env bash
# Every GPU check and figure of tests/gpu/README.md and docs/performance.md in one command, on a
# machine with one CUDA GPU, each into a log of its own under OUTDIR:
#
#   bash scripts/gpu_checks.sh OUTDIR [VERL_WHEEL]
#
# - environment.txt: GPU, driver, torch, Triton and megatron-core versions;
# - tests_gpu.txt: pytest tests/gpu (the compiled kernels against float64, the hf engine's step on
#   CUDA against the CPU, the Megatron engine against the hf engine);
# - logits_tp{1,2,4}.txt: benchmarks/vocab_stats.py on [8192, 152064 / TP] bf16 logits: the
#   Triton kernel, the torch kernel, the naive fp32 log-softmax and the three-all-reduce recipe,
#   forward and forward+backward, against the device copy bandwidth of the same run;
# - linear_tp{1,2}.txt: the fused output layer against matmul + torch kernel (and verl's fused
#   kernel when VERL_WHEEL, verl's wheel file, is given) on hidden [8192, 3584] and weight
#   [152064 / TP, 3584] bf16, against the bf16 matmul rate of the same run;
# - kernel_sweep.txt: benchmarks/kernel_sweep.py, the Triton kernels' tile sizes timed alone and
#   where token_stats's forward spends its time;
# - engine_{hf,megatron}_{cuda,cpu}[_bf16].txt: benchmarks/engine_passes.py, each engine's
#   token-stats pass and loss pass (forward + backward + optimizer step) on one GPU and on the
#   machine's CPU cores, the same model and batch, and the host synchronisations per micro-batch
#   on CUDA.
#
# Python packages the repository needs beyond the machine's torch, Triton and transformers
# (megatron-core, omegaconf, hydra-core) must be installed first (tests/gpu/README.md, "Running
# them"). Every step runs even when an earlier one fails, each within $STEP_LIMIT seconds (default
# 240); the exit status is 1 if any failed. $PYTHON picks the interpreter (default python3).
set -uo pipefail
out="${1:?usage: bash scripts/gpu_checks.sh OUTDIR [VERL_WHEEL]}"
verl="${2:-}"
python="${PYTHON:-python3}"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the benchmarks import opefo_nemo
limit="${STEP_LIMIT:-240}"
failed=0

step() {
    local name=$1
    shift
    local start=$SECONDS
    local run=("$@")
    declare -F "$1" >/dev/null || run=(timeout --kill-after=10 "$limit" "$@")
    if "${run[@]}" >"$out/$name.txt" 2>&1; then
        echo "gpu_checks: $name ok ($((SECONDS - start)) s)"
    else
        echo "gpu_checks: $name FAILED ($((SECONDS - start)) s), see $out/$name.txt"
        failed=1
    fi
}

# shellcheck disable=SC2317  # called through step
environment() {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$python" -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
    "$python" -c 'import megatron.core; print("megatron-core", megatron.core.__version__)'
}

step environment environment
step tests_gpu "$python" -m pytest tests/gpu -q -rA
for tp in 1 2 4; do
    step "logits_tp$tp" "$python" benchmarks/vocab_stats.py --device cuda --tokens 8192 \
        --vocab 152064 --tp "$tp" --repeat 10 --methods triton ours naive three_allreduce
done
linear=(--methods fused_linear unfused_linear)
[[ -n "$verl" ]] && linear=(--methods fused_linear unfused_linear verl_linear --verl-wheel "$verl")
for tp in 1 2; do
    step "linear_tp$tp" "$python" benchmarks/vocab_stats.py --device cuda --tokens 8192 \
        --vocab 152064 --tp "$tp" --hidden 3584 --repeat 10 "${linear[@]}"
done
step kernel_sweep "$python" benchmarks/kernel_sweep.py --tokens 8192 --vocab 152064 --tp 1 4 \
    --hidden 3584
engine=(--tp 1 --hidden 512 --layers 4 --responses 16 --prompt-tokens 64 --response-tokens 192)
for name in hf megatron; do
    for device in cuda cpu; do
        step "engine_${name}_$device" "$python" benchmarks/engine_passes.py --engine "$name" \
            --device "$device" "${engine[@]}"
    done
    step "engine_${name}_cuda_bf16" "$python" benchmarks/engine_passes.py --engine "$name" \
        --device cuda --dtype bfloat16 "${engine[@]}"
done
exit "$failed"
