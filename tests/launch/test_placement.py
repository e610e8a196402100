"""Colocated vLLM placement against a brute-force enumeration of the allocation's GPUs."""

from __future__ import annotations

import itertools

import pytest

from opefo_nemo.launch.placement import (
    ColocatedPlacement,
    PlacementError,
    device_slices,
    vllm_tensor_parallel_problems,
)


def _gpus(world_size: int, gpus_per_node: int) -> dict[int, tuple[int, int]]:
    """Every rank's (node, local GPU), as Slurm numbers them: node-major."""
    ranks = itertools.count()
    return {
        next(ranks): (node, gpu)
        for node in range(world_size // gpus_per_node)
        for gpu in range(gpus_per_node)
    }


@pytest.mark.parametrize(
    "world_size, gpus_per_node, tp",
    [(1, 1, 1), (8, 8, 1), (8, 8, 2), (32, 8, 4), (32, 8, 8), (12, 4, 2), (6, 6, 3)],
)
def test_servers_partition_the_gpus_node_by_node(world_size, gpus_per_node, tp):
    placement = ColocatedPlacement(world_size, gpus_per_node, tp)
    where = _gpus(world_size, gpus_per_node)
    servers = placement.servers
    assert len(servers) == placement.num_servers == world_size // tp
    covered = [rank for server in servers for rank in server.ranks]
    assert sorted(covered) == list(range(world_size))  # every rank in exactly one server
    for index, server in enumerate(servers):
        assert server.index == index and len(server.ranks) == tp
        assert {where[rank][0] for rank in server.ranks} == {server.node}  # one node
        assert server.local_gpus == tuple(where[rank][1] for rank in server.ranks)
        assert server.leader == min(server.ranks)
        assert server.visible_devices() == ",".join(map(str, server.local_gpus))
        for rank in server.ranks:
            assert placement.server_of_rank(rank) == server


@pytest.mark.parametrize("prompts, servers", [(0, 3), (5, 3), (32, 32), (33, 8), (7, 1)])
def test_prompt_shares_are_contiguous_and_balanced(prompts, servers):
    shares = ColocatedPlacement(servers, servers, 1).prompt_shares(prompts)
    assert [i for share in shares for i in share] == list(range(prompts))  # order kept
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_bad_allocations_are_named():
    with pytest.raises(PlacementError, match="rollout_tp_size 3 does not divide the 8 GPUs"):
        ColocatedPlacement(16, 8, 3)
    with pytest.raises(PlacementError, match="world size 12 is not a whole number of nodes of 8"):
        ColocatedPlacement(12, 8, 1)
    with pytest.raises(PlacementError, match="rollout_tp_size must be a positive integer"):
        ColocatedPlacement(8, 8, 0)
    with pytest.raises(IndexError):
        ColocatedPlacement(8, 8, 2).server_of_rank(8)
    with pytest.raises(PlacementError, match="num_prompts"):
        ColocatedPlacement(8, 8, 2).prompt_shares(-1)


def test_visible_devices_map_through_the_parent_list():
    server = ColocatedPlacement(16, 8, 2).server(5)  # node 1, local GPUs 2 and 3
    assert (server.node, server.local_gpus) == (1, (2, 3))
    assert server.visible_devices(None) == "2,3"
    assert server.visible_devices("4,5,6,7,0,1,2,3") == "6,7"
    assert server.visible_devices("GPU-a, GPU-b,GPU-c,GPU-d") == "GPU-c,GPU-d"
    with pytest.raises(PlacementError, match="every rank must see all GPUs"):
        server.visible_devices("0")


def test_vllm_sharding_rules():
    # Qwen2.5-7B: 28 query heads, 4 key/value heads.
    assert vllm_tensor_parallel_problems(4, 28, 4) == []
    assert vllm_tensor_parallel_problems(2, 28, 4) == []
    problems = vllm_tensor_parallel_problems(8, 28, 4)
    assert problems == [
        "engine.rollout_tp_size 8 does not divide the model's num_attention_heads = 28"
    ]  # 8 is a multiple of the 4 KV heads: vLLM replicates them
    problems = vllm_tensor_parallel_problems(3, 24, 4)
    assert len(problems) == 1 and "num_key_value_heads = 4" in problems[0]


def test_one_process_servers_each_get_their_own_gpus():
    """``opefo-eval --num-servers`` / ``rollout.num_servers``: disjoint slices that together are
    the first ``servers × g`` visible GPUs, in order (before, every server saw GPU 0)."""
    assert device_slices(8, 1, 8, None) == [str(i) for i in range(8)]
    assert device_slices(2, 2, 4, "3,5,6,7") == ["3,5", "6,7"]
    uuids = "GPU-a,GPU-b,GPU-c"
    assert device_slices(3, 1, 3, uuids) == ["GPU-a", "GPU-b", "GPU-c"]
    for servers, per, count in [(1, 1, 1), (3, 2, 8), (4, 2, 8)]:
        slices = device_slices(servers, per, count, None)
        flat = [d for s in slices for d in s.split(",")]
        assert flat == [str(i) for i in range(servers * per)]
    assert device_slices(4, 1, 0, None) is None  # CPU servers: no slice
    with pytest.raises(PlacementError, match="need 9 GPUs, but this process sees 8"):
        device_slices(9, 1, 8, None)
