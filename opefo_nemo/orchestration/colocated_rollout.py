"""The rollout engine of a multi-rank run: vLLM servers colocated on the training GPUs, each owned
by the lowest rank of its group (docs/training.md, "Several ranks"). Every method is collective:
every rank calls it with the same arguments and learns of any rank's failure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import cast

from torch import Tensor

from opefo_nemo.launch.placement import ColocatedPlacement
from opefo_nemo.orchestration.protocols import RolloutEngine
from opefo_nemo.orchestration.ranks import LoopRanks
from opefo_nemo.orchestration.rollout_guard import TRANSPORT_FAILURES
from opefo_nemo.rollout import Completion, SamplingConfig

StartServer = Callable[[ColocatedPlacement, int], RolloutEngine]
"""``start(placement, server_index) -> engine``: starts one server on this leader's GPUs."""


@dataclasses.dataclass(frozen=True)
class _Failure:
    """A leader's failed request: ``restartable`` for a dead server, else a bad request."""

    message: str
    restartable: bool


class ColocatedRollout:
    """``RolloutEngine`` over the placement's servers; ``weights()`` yields the policy's
    current weights (collective), used to load a restarted server. A server that dies (the
    transport failures of :mod:`.rollout_guard`) is restarted on its leader, loaded and the
    request retried, at most ``max_restarts`` times in the run, counted the same on every rank;
    then the run fails naming the rank (a rank that raised alone would leave the others
    waiting)."""

    def __init__(
        self,
        ranks: LoopRanks,
        placement: ColocatedPlacement,
        start_server: StartServer,
        weights: Callable[[], Iterator[tuple[str, Tensor]]],
        max_restarts: int,
    ):
        if placement.world_size != ranks.world_size:
            raise ValueError(
                f"the placement is for {placement.world_size} ranks, the run has {ranks.world_size}"
            )
        self.ranks = ranks
        self.placement = placement
        self.start_server = start_server
        self.weights = weights
        self.max_restarts = max_restarts
        self.restarts = 0
        self.server = placement.server_of_rank(ranks.rank)
        self.is_leader = self.server.leader == ranks.rank
        self.local: RolloutEngine | None = None
        failure = self._start() if self.is_leader else None
        self._raise_any(self.ranks.gather(failure), "could not start its rollout server")

    # ----------------------------------------------------------------- the protocol
    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[Completion]:
        """``n`` completions per prompt, prompt-major, the same on every rank: leader ``k`` asks
        its server for the prompts of share ``k``, and the shares are gathered in prompt order
        with their global prompt indices."""
        share = self.placement.prompt_shares(len(prompts))[self.server.index]
        gathered = self.ranks.gather(self._generate_share(prompts, share, n, sampling))
        if self._restart_failed(gathered):
            gathered = self.ranks.gather(self._generate_share(prompts, share, n, sampling))
        self._raise_any(gathered, "failed to generate")
        parts = cast("list[list[Completion]]", gathered)  # _raise_any raised on a failure
        return [c for part in parts for c in part]

    def update_weights(self, named_weights: Iterable[tuple[str, Tensor]]) -> None:
        """Every rank walks ``named_weights`` to its end (for a Megatron policy the walk is itself
        collective: TP gathers, PP broadcasts); leaders load them into their server."""
        gathered = self.ranks.gather(self._load(named_weights, self.is_leader))
        if not self._restart_failed(gathered):
            self._raise_any(gathered, "failed to load weights")

    def sleep(self) -> None:
        if self.is_leader:
            self._engine.sleep()

    def wake(self, tags: Sequence[str] | None = None) -> None:
        if self.is_leader:
            self._engine.wake(tags)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
            self.local = None

    # ----------------------------------------------------------------- internals
    @property
    def _engine(self) -> RolloutEngine:
        """This leader's server (a leader holds one once started)."""
        assert self.local is not None, "no rollout server on this rank"
        return self.local

    def _start(self) -> _Failure | None:
        try:
            self.local = self.start_server(self.placement, self.server.index)
        except Exception as error:
            return _Failure(f"{type(error).__name__}: {error}", restartable=False)
        return None

    def _generate_share(
        self, prompts: list[list[int]], share: range, n: int, sampling: SamplingConfig
    ) -> list[Completion] | _Failure:
        if not self.is_leader or not len(share):
            return []
        # Prompt ``i`` is still sampled with seed ``seed + i · n``, as by one server.
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + share.start * n)
        try:
            local = self._engine.generate(prompts[share.start : share.stop], n, sampling)
        except TRANSPORT_FAILURES as error:
            return _Failure(str(error), restartable=True)
        except Exception as error:
            return _Failure(f"{type(error).__name__}: {error}", restartable=False)
        return [dataclasses.replace(c, prompt_index=c.prompt_index + share.start) for c in local]

    def _load(self, named_weights: Iterable[tuple[str, Tensor]], load: bool) -> _Failure | None:
        stream = iter(named_weights)
        try:
            if load:
                self._engine.update_weights(stream)
        except TRANSPORT_FAILURES as error:
            return _Failure(str(error), restartable=True)
        except Exception as error:
            return _Failure(f"{type(error).__name__}: {error}", restartable=False)
        finally:
            for _ in stream:  # the rest of the walk: other ranks' collectives wait for it
                pass
        return None

    def _restart_failed(self, gathered: list) -> bool:
        """Restart the servers whose leaders reported a dead server; ``True`` if any was."""
        dead = [r for r, part in enumerate(gathered) if isinstance(part, _Failure)]
        if not dead or not all(gathered[r].restartable for r in dead):
            return False
        if self.restarts >= self.max_restarts:
            self._raise_any(
                gathered,
                f"lost its rollout server, already restarted {self.restarts} time(s) "
                f"(rollout.max_restarts={self.max_restarts})",
            )
        self.restarts += 1
        restarting = self.ranks.rank in dead
        if restarting:
            self._engine.close()
        failure = self._start() if restarting else None
        self._raise_any(self.ranks.gather(failure), "could not restart its rollout server")
        failure = self._load(self.weights(), restarting)
        self._raise_any(self.ranks.gather(failure), "failed to load weights after a restart")
        return True

    @staticmethod
    def _raise_any(gathered: list, what: str) -> None:
        for rank, part in enumerate(gathered):
            if isinstance(part, _Failure):
                raise RuntimeError(f"rank {rank} {what}: {part.message}")
