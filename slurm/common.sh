# shellcheck shell=bash
# Shared logic of the opefo-nemo sbatch scripts (docs/cluster.md). Sourced, never run:
#
#   source "$OPEFO_HOME/slurm/common.sh"
#   opefo_init DEFAULT_PRESET "$@"      # settings, fail-fast checks, log directory, overrides
#   opefo_resume_override               # training: a requeued attempt continues its run
#   opefo_node_check "${OPEFO_OVERRIDES[@]}"  # opefo-node-check on every node; exits on a problem
#   opefo_preflight                     # opefo-preflight on one task; exits on any problem
#   opefo_launch opefo-train            # one task per GPU; USR1 → checkpoint → requeue
#
# Environment (defaults in brackets):
#   OPEFO_CONTAINER   pyxis | none [pyxis]; none runs the installed package on the nodes
#   OPEFO_IMAGE       image for pyxis: a .sqsh file or a registry reference
#                     [$OPEFO_HOME/opefo-nemo.sqsh, made by containers/enroot_import.sh]
#   OPEFO_DATA_DIR    data sets, mounted at /data in the container [$OPEFO_HOME/data]
#   OPEFO_MODEL_DIR   model checkpoints, mounted at /models [$OPEFO_HOME/models]
#   OPEFO_CKPT_DIR    training checkpoints, mounted at /checkpoints [$OPEFO_HOME/checkpoints];
#                     created if missing
#   OPEFO_LOG_ROOT    where each job's log directory goes [$OPEFO_HOME/logs]
#   OPEFO_MOUNTS      extra pyxis mounts, comma-separated SRC:DST [none]
#   OPEFO_HOME        the repository [$SLURM_SUBMIT_DIR]
#   OPEFO_GPU_MEMORY_GIB  GPU memory preflight assumes when it sees no GPU [unset: the GPU's own]
#   OPEFO_NODE_CACHE  node-local directory for the vLLM, Triton, torch compile and XDG caches
#                     [/tmp/opefo-cache-$SLURM_JOB_ID]; VLLM_CACHE_ROOT, TRITON_CACHE_DIR,
#                     TORCHINDUCTOR_CACHE_DIR and XDG_CACHE_HOME, when set, win
# The config sees the in-container paths (or the host paths without a container) through the
# same variables, e.g. ${oc.env:OPEFO_MODEL_DIR} in conf/preset/*.yaml.

opefo_die() {
    echo "opefo: error: $*" >&2
    exit 1
}

opefo_log() {
    echo "opefo: $(date -u +%FT%TZ) $*"
}

# Host path → container path for the three standard mounts.
declare -A OPEFO_MOUNT_POINTS=([OPEFO_DATA_DIR]=/data [OPEFO_MODEL_DIR]=/models
    [OPEFO_CKPT_DIR]=/checkpoints)

opefo_check_paths() {
    local var
    for var in OPEFO_DATA_DIR OPEFO_MODEL_DIR; do
        [[ -d "${!var}" && -r "${!var}" && -x "${!var}" ]] \
            || opefo_die "$var=${!var} is not a readable directory"
    done
    mkdir -p "$OPEFO_CKPT_DIR" 2>/dev/null \
        || opefo_die "OPEFO_CKPT_DIR=$OPEFO_CKPT_DIR does not exist and cannot be created"
    [[ -w "$OPEFO_CKPT_DIR" ]] || opefo_die "OPEFO_CKPT_DIR=$OPEFO_CKPT_DIR is not writable"
    case "$OPEFO_CONTAINER" in
        none)
            command -v opefo-train >/dev/null 2>&1 \
                || opefo_die "OPEFO_CONTAINER=none but opefo-train is not on PATH" \
                    "(activate the environment that has opefo-nemo installed)"
            ;;
        pyxis)
            # A file path (absolute, relative or *.sqsh) must exist; a registry reference is
            # pulled by pyxis and can only fail there.
            if [[ "$OPEFO_IMAGE" == /* || "$OPEFO_IMAGE" == ./* || "$OPEFO_IMAGE" == *.sqsh ]]; then
                [[ -r "$OPEFO_IMAGE" ]] || opefo_die "OPEFO_IMAGE=$OPEFO_IMAGE does not exist" \
                    "(build it with containers/build.sh and containers/enroot_import.sh)"
            fi
            ;;
        *) opefo_die "OPEFO_CONTAINER=$OPEFO_CONTAINER: expected pyxis or none" ;;
    esac
}

# Hydra overrides: +preset=DEFAULT unless the caller chose a preset, then the caller's own.
opefo_overrides() {
    local default_preset="$1" arg
    shift
    OPEFO_OVERRIDES=()
    for arg in "$@"; do
        if [[ "$arg" == preset=* || "$arg" == +preset=* ]]; then
            default_preset=""
        fi
    done
    if [[ -n "$default_preset" ]]; then
        OPEFO_OVERRIDES+=("+preset=$default_preset")
    fi
    OPEFO_OVERRIDES+=("$@")
}

# The trainer continues whatever run.output_dir holds (checkpoint.resume=auto, its default), so a
# requeued attempt resumes by itself, wherever the overrides put the run. An attempt after the
# first also replaces the caller's checkpoint.resume (`fresh` would refuse the directory the
# first attempt wrote; a checkpoint path would go back to it) with `auto`.
opefo_resume_override() {
    local arg kept=()
    [[ "$OPEFO_ATTEMPT" -gt 0 ]] || return 0
    for arg in "${OPEFO_OVERRIDES[@]}"; do
        [[ "$arg" == checkpoint.resume=* ]] || kept+=("$arg")
    done
    OPEFO_OVERRIDES=("${kept[@]}" "checkpoint.resume=auto")
    opefo_log "attempt $OPEFO_ATTEMPT continues its run.output_dir from the newest checkpoint" \
        "(checkpoint.resume=auto)"
}

# The path a task sees for one of the standard directories (OPEFO_DATA_DIR, ...): its mount
# point in the container, the host path without one.
opefo_task_path() {
    if [[ "$OPEFO_CONTAINER" == pyxis ]]; then
        echo "${OPEFO_MOUNT_POINTS[$1]}"
    else
        echo "${!1}"
    fi
}

opefo_nccl_defaults() {
    # A100 nodes with InfiniBand; every value can be overridden from the environment.
    export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
    export NCCL_IB_TIMEOUT="${NCCL_IB_TIMEOUT:-22}"   # 4.096 µs × 2^22 ≈ 17 s per IB retry
    export NCCL_IB_RETRY_CNT="${NCCL_IB_RETRY_CNT:-7}"
    export NCCL_ASYNC_ERROR_HANDLING="${NCCL_ASYNC_ERROR_HANDLING:-1}"
    export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
    export TORCH_NCCL_AVOID_RECORD_STREAMS="${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}"
    # Megatron overlaps TP communication with compute only with one hardware queue.
    export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
}

opefo_rendezvous() {
    # The first node of the allocation hosts the rendezvous; the port depends on the job id so
    # two jobs sharing a node do not collide, and stays in 10000-29999: below Linux's ephemeral
    # range (net.ipv4.ip_local_port_range, 32768-60999 by default), where outgoing connections
    # take their ports.
    MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
    MASTER_PORT="${MASTER_PORT:-$((10000 + SLURM_JOB_ID % 20000))}"
    export MASTER_ADDR MASTER_PORT
    export WORLD_SIZE="$SLURM_NTASKS"
}

opefo_task_resources() {
    # Since Slurm 22.05 srun does not inherit the job's --cpus-per-task: without this every
    # task (a training rank and its vLLM server) would be bound to one CPU.
    if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then
        export SRUN_CPUS_PER_TASK="${SRUN_CPUS_PER_TASK:-$SLURM_CPUS_PER_TASK}"
    fi
    # vLLM, Triton and torch compile write caches; in the container $HOME is not mounted
    # (--no-container-mount-home), so they get a node-local directory of their own.
    OPEFO_NODE_CACHE="${OPEFO_NODE_CACHE:-/tmp/opefo-cache-$SLURM_JOB_ID}"
    export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$OPEFO_NODE_CACHE/vllm}"
    export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$OPEFO_NODE_CACHE/triton}"
    export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$OPEFO_NODE_CACHE/inductor}"
    export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$OPEFO_NODE_CACHE/xdg}"
}

opefo_init() {
    [[ -n "${SLURM_JOB_ID:-}" ]] || opefo_die "run this script with sbatch"
    OPEFO_HOME="${OPEFO_HOME:-$SLURM_SUBMIT_DIR}"
    OPEFO_CONTAINER="${OPEFO_CONTAINER:-pyxis}"
    OPEFO_IMAGE="${OPEFO_IMAGE:-$OPEFO_HOME/opefo-nemo.sqsh}"
    OPEFO_DATA_DIR="${OPEFO_DATA_DIR:-$OPEFO_HOME/data}"
    OPEFO_MODEL_DIR="${OPEFO_MODEL_DIR:-$OPEFO_HOME/models}"
    OPEFO_CKPT_DIR="${OPEFO_CKPT_DIR:-$OPEFO_HOME/checkpoints}"
    OPEFO_LOG_ROOT="${OPEFO_LOG_ROOT:-$OPEFO_HOME/logs}"
    opefo_check_paths

    OPEFO_RUN_NAME="${SLURM_JOB_NAME}-${SLURM_JOB_ID}"
    OPEFO_JOB_DIR="$OPEFO_LOG_ROOT/$OPEFO_RUN_NAME"
    OPEFO_ATTEMPT="${SLURM_RESTART_COUNT:-0}"
    OPEFO_ATTEMPT_DIR="$OPEFO_JOB_DIR/attempt-$OPEFO_ATTEMPT"
    mkdir -p "$OPEFO_ATTEMPT_DIR" || opefo_die "cannot create log directory $OPEFO_ATTEMPT_DIR"

    opefo_overrides "$@"
    opefo_nccl_defaults
    opefo_rendezvous
    opefo_task_resources

    # Paths as the trainer sees them: mount points in the container, host paths without one.
    local var
    OPEFO_TASK_ENV=()
    OPEFO_CONTAINER_MOUNTS=()
    for var in OPEFO_DATA_DIR OPEFO_MODEL_DIR OPEFO_CKPT_DIR; do
        if [[ "$OPEFO_CONTAINER" == pyxis ]]; then
            OPEFO_CONTAINER_MOUNTS+=("${!var}:${OPEFO_MOUNT_POINTS[$var]}")
        fi
        OPEFO_TASK_ENV+=("$var=$(opefo_task_path "$var")")
    done
    # The job's log directory has the same path inside the container.
    if [[ "$OPEFO_CONTAINER" == pyxis ]]; then
        OPEFO_CONTAINER_MOUNTS+=("$OPEFO_JOB_DIR:$OPEFO_JOB_DIR")
    fi
    # The presets put the trainer's output (metrics, checkpoints) under
    # $OPEFO_CKPT_DIR/$OPEFO_RUN_NAME: the same directory on every requeued attempt.
    OPEFO_TASK_ENV+=("OPEFO_RUN_NAME=$OPEFO_RUN_NAME")

    {
        echo "job=$SLURM_JOB_ID name=$SLURM_JOB_NAME attempt=$OPEFO_ATTEMPT"
        echo "nodes=$SLURM_JOB_NODELIST tasks=$SLURM_NTASKS master=$MASTER_ADDR:$MASTER_PORT"
        echo "container=$OPEFO_CONTAINER image=$OPEFO_IMAGE cpus_per_task=${SRUN_CPUS_PER_TASK:-}"
        echo "caches=$OPEFO_NODE_CACHE"
        echo "data=$OPEFO_DATA_DIR models=$OPEFO_MODEL_DIR checkpoints=$OPEFO_CKPT_DIR"
        echo "commit=$(git -C "$OPEFO_HOME" rev-parse HEAD 2>/dev/null || echo unknown)"
        printf 'override=%s\n' "${OPEFO_OVERRIDES[@]}"
    } >>"$OPEFO_JOB_DIR/job.txt"
    opefo_srun_command
    opefo_log "log directory $OPEFO_JOB_DIR (attempt $OPEFO_ATTEMPT)"
}

# OPEFO_SRUN: srun with the container flags (or none) and the task environment. An array, not a
# function, so that `"${OPEFO_SRUN[@]}" ... &` makes srun itself the background process.
opefo_srun_command() {
    OPEFO_SRUN=(srun)
    if [[ "$OPEFO_CONTAINER" == pyxis ]]; then
        local mounts
        mounts="$(IFS=,; echo "${OPEFO_CONTAINER_MOUNTS[*]}")${OPEFO_MOUNTS:+,$OPEFO_MOUNTS}"
        OPEFO_SRUN+=(--container-image="$OPEFO_IMAGE" --container-mounts="$mounts"
            --container-workdir=/opt/opefo-nemo --no-container-mount-home)
    fi
    OPEFO_SRUN+=(--export="ALL,$(IFS=,; echo "${OPEFO_TASK_ENV[*]}")")
}

# opefo-node-check on the first task of every node (one task per node), before any training
# rank starts: driver, GPUs, the rollout environment, caches, disk (docs/cluster.md). Its
# arguments go to opefo-node-check (the training overrides, or its own options).
opefo_node_check() {
    local per_node="${SLURM_NTASKS_PER_NODE:-1}" nodes="${SLURM_JOB_NUM_NODES:-1}" status=0
    per_node="${per_node%%(*}"
    opefo_log "node check on $nodes node(s)"
    "${OPEFO_SRUN[@]}" --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 \
        --output="$OPEFO_ATTEMPT_DIR/node-check-%N.log" \
        opefo-node-check --tasks-per-node "$per_node" --gpus "${SLURM_GPUS_ON_NODE:-0}" "$@" \
        || status=$?
    cat "$OPEFO_ATTEMPT_DIR"/node-check-*.log
    [[ $status -eq 0 ]] || opefo_die "node check found problems (above; also in" \
        "$OPEFO_ATTEMPT_DIR/node-check-<node>.log); nothing was launched"
}

opefo_preflight() {
    # The job's task counts, read here: inside the one-task step Slurm describes that step.
    local per_node="${SLURM_NTASKS_PER_NODE:-0}"
    per_node="${per_node%%(*}"
    opefo_log "preflight for $SLURM_NTASKS tasks ($per_node per node)"
    local status=0
    "${OPEFO_SRUN[@]}" --nodes=1 --ntasks=1 --output="$OPEFO_ATTEMPT_DIR/preflight.log" \
        opefo-preflight --world-size "$SLURM_NTASKS" --gpus-per-node "$per_node" \
        "${OPEFO_OVERRIDES[@]}" || status=$?
    cat "$OPEFO_ATTEMPT_DIR/preflight.log"
    [[ $status -eq 0 ]] || opefo_die "preflight found problems (above; also in" \
        "$OPEFO_ATTEMPT_DIR/preflight.log); nothing was launched"
}

OPEFO_PREEMPTED=0
opefo_on_usr1() {
    # Slurm's --signal=B:USR1@N before the time limit: ask every task to checkpoint and exit
    # (srun forwards USR1 to the tasks), then requeue once they are done.
    OPEFO_PREEMPTED=1
    opefo_log "USR1: time limit near; asking the trainer to checkpoint"
    if [[ -n "${OPEFO_STEP_PID:-}" ]]; then
        kill -USR1 "$OPEFO_STEP_PID" 2>/dev/null || true
    fi
}

# Run COMMAND on one task per GPU (the allocation's tasks), with the overrides; on USR1 the
# tasks checkpoint, and the job is requeued to resume from that checkpoint.
opefo_launch() {
    trap opefo_on_usr1 USR1
    opefo_log "launching $* on $SLURM_NTASKS tasks"
    # shellcheck disable=SC2016  # expanded by the task's shell, not here
    "${OPEFO_SRUN[@]}" --kill-on-bad-exit=1 --output="$OPEFO_ATTEMPT_DIR/rank-%t.log" \
        bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \
            LOCAL_WORLD_SIZE=${SLURM_NTASKS_PER_NODE%%(*}
            cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys both
            echo "opefo: task $RANK on $(hostname): $cpus CPU(s) of its binding" \
                "(--cpus-per-task ${SLURM_CPUS_PER_TASK:-unset})"
            exec "$@"' opefo-task \
        "$@" "${OPEFO_OVERRIDES[@]}" &
    OPEFO_STEP_PID=$!
    local status=0
    # `wait` returns early when a trap fires; wait again until the step has really ended.
    while true; do
        wait "$OPEFO_STEP_PID" && status=0 || status=$?
        kill -0 "$OPEFO_STEP_PID" 2>/dev/null || break
    done
    if [[ $OPEFO_PREEMPTED -eq 1 ]]; then
        opefo_log "tasks exited with $status after USR1; requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    opefo_log "tasks exited with $status; per-rank logs in $OPEFO_ATTEMPT_DIR"
    return "$status"
}
