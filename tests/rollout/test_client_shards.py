"""How the client splits a request over its servers (``rollout/client.py``): contiguous shards that
cover every item in order and differ in size by at most one."""

from __future__ import annotations

import pytest

from opefo_nemo.rollout.client import _contiguous_shards


@pytest.mark.parametrize("num_items,num_parts", [(10, 2), (5, 3), (2, 4), (0, 2), (7, 1)])
def test_contiguous_shards_cover_in_order_and_balance(num_items, num_parts):
    shards = _contiguous_shards(num_items, num_parts)
    assert len(shards) == num_parts
    covered = [i for start, stop in shards for i in range(start, stop)]
    assert covered == list(range(num_items))
    sizes = [stop - start for start, stop in shards]
    assert max(sizes) - min(sizes) <= 1
