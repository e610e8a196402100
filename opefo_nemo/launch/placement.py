"""Where the colocated vLLM servers run on a training allocation, and which ranks feed them: one
server per ``rollout_tp_size`` consecutive GPUs of a node (docs/cluster.md, "The engines on the
cluster"). Pure Python: this module imports neither torch nor vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass


class PlacementError(ValueError):
    """The allocation cannot host colocated servers of the requested size."""


@dataclass(frozen=True)
class ServerPlacement:
    """One colocated vLLM server: its ``index``, the ``node`` it runs on, the node-local GPU
    indices it uses (``CUDA_VISIBLE_DEVICES``) and the global training ranks on those GPUs
    (the first one, ``leader``, drives it: it starts the server with those GPUs visible, sends it
    the weights through CUDA IPC and asks for its share of the prompts)."""

    index: int
    node: int
    local_gpus: tuple[int, ...]
    ranks: tuple[int, ...]

    @property
    def leader(self) -> int:
        return self.ranks[0]

    def visible_devices(self, parent: str | None = None) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` value the server process is started with: its local GPU
        indices, mapped through the trainer's own ``CUDA_VISIBLE_DEVICES`` (``parent``: indices
        or UUIDs; unset or empty: every GPU of the node is visible)."""
        if not parent:
            return ",".join(str(gpu) for gpu in self.local_gpus)
        devices = [d.strip() for d in parent.split(",") if d.strip()]
        if max(self.local_gpus) >= len(devices):
            raise PlacementError(
                f"server {self.index} needs node-local GPUs {list(self.local_gpus)} but "
                f"CUDA_VISIBLE_DEVICES={parent!r} shows {len(devices)}: every rank must see all "
                "GPUs of its node (no per-task GPU binding)"
            )
        return ",".join(devices[gpu] for gpu in self.local_gpus)


@dataclass(frozen=True)
class ColocatedPlacement:
    """The servers of a ``world_size``-rank allocation with ``gpus_per_node`` ranks per node.

    Ranks are numbered node-major, as Slurm and ``torchrun`` do: global rank ``r`` runs on node
    ``r // gpus_per_node`` with local GPU ``r % gpus_per_node``. Each node's GPUs are cut into
    consecutive groups of ``rollout_tp_size``, each hosting one vLLM server of that
    tensor-parallel size, so there are ``world_size / rollout_tp_size`` servers and rank ``r``
    feeds server ``r // rollout_tp_size``. A group never spans two nodes (CUDA IPC needs one
    node): ``rollout_tp_size`` must divide ``gpus_per_node``."""

    world_size: int
    gpus_per_node: int
    rollout_tp_size: int

    def __post_init__(self) -> None:
        for name in ("world_size", "gpus_per_node", "rollout_tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlacementError(f"{name} must be a positive integer, got {value!r}")
        if self.world_size % self.gpus_per_node:
            raise PlacementError(
                f"world size {self.world_size} is not a whole number of nodes of "
                f"{self.gpus_per_node} GPUs"
            )
        if self.gpus_per_node % self.rollout_tp_size:
            raise PlacementError(
                f"engine.rollout_tp_size {self.rollout_tp_size} does not divide the "
                f"{self.gpus_per_node} GPUs of a node: a vLLM server's GPUs must sit on one node"
            )

    @property
    def num_servers(self) -> int:
        return self.world_size // self.rollout_tp_size

    @property
    def servers(self) -> tuple[ServerPlacement, ...]:
        """Every server, in index order."""
        return tuple(self.server(index) for index in range(self.num_servers))

    def server(self, index: int) -> ServerPlacement:
        """Server ``index`` (0 ≤ index < :attr:`num_servers`)."""
        if not 0 <= index < self.num_servers:
            raise IndexError(f"server {index} out of range 0..{self.num_servers - 1}")
        first = index * self.rollout_tp_size
        ranks = tuple(range(first, first + self.rollout_tp_size))
        local = tuple(rank % self.gpus_per_node for rank in ranks)
        return ServerPlacement(index, first // self.gpus_per_node, local, ranks)

    def server_of_rank(self, rank: int) -> ServerPlacement:
        """The server colocated with global training rank ``rank``."""
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} out of range 0..{self.world_size - 1}")
        return self.server(rank // self.rollout_tp_size)

    def prompt_shares(self, num_prompts: int) -> tuple[range, ...]:
        """The prompt indices each server generates for, contiguous, nearly equal (the first
        ``P mod S`` servers get one more) and in server order, so the completions concatenated in
        server order are the prompt-major batch one server would return."""
        if num_prompts < 0:
            raise PlacementError(f"num_prompts must be >= 0, got {num_prompts}")
        base, extra = divmod(num_prompts, self.num_servers)
        shares, start = [], 0
        for index in range(self.num_servers):
            size = base + (1 if index < extra else 0)
            shares.append(range(start, start + size))
            start += size
        return tuple(shares)


def device_slices(
    num_servers: int, gpus_per_server: int, gpu_count: int, parent: str | None
) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` for each of the ``num_servers`` servers one process starts on the
    ``gpu_count`` GPUs it sees (``opefo-eval --num-servers``, ``rollout.num_servers``): server
    ``k`` gets visible GPUs ``[k · g, (k + 1) · g)``, ``g = gpus_per_server``, mapped through
    the process's own ``CUDA_VISIBLE_DEVICES`` (``parent``: indices or UUIDs; unset: all).
    ``None`` without GPUs (CPU servers need no slice)."""
    if gpu_count == 0:
        return None
    devices = [d.strip() for d in parent.split(",") if d.strip()] if parent else []
    devices = devices or [str(i) for i in range(gpu_count)]
    need = num_servers * gpus_per_server
    if need > len(devices):
        raise PlacementError(
            f"{num_servers} vLLM server(s) of {gpus_per_server} GPU(s) each need {need} GPUs, "
            f"but this process sees {len(devices)} ({','.join(devices)}): start fewer servers"
        )
    return [
        ",".join(devices[k * gpus_per_server : (k + 1) * gpus_per_server])
        for k in range(num_servers)
    ]


def vllm_tensor_parallel_problems(
    rollout_tp_size: int, num_attention_heads: int, num_key_value_heads: int
) -> list[str]:
    """Why vLLM could not shard this model over ``rollout_tp_size`` GPUs (empty: it can).

    vLLM splits the query heads evenly over its TP ranks, and the key/value heads either evenly
    or, with fewer KV heads than ranks, replicated (the rank count a multiple of the KV heads).
    """
    problems = []
    if num_attention_heads % rollout_tp_size:
        problems.append(
            f"engine.rollout_tp_size {rollout_tp_size} does not divide the model's "
            f"num_attention_heads = {num_attention_heads}"
        )
    kv = num_key_value_heads
    if kv % rollout_tp_size and rollout_tp_size % kv:
        problems.append(
            f"engine.rollout_tp_size {rollout_tp_size} and the model's num_key_value_heads = "
            f"{kv}: one must divide the other"
        )
    return problems
