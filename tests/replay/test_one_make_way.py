"""One "who makes way" (issue 39 item 2): the replay decides nothing of its own. At every step of
a replay where it asks who makes way, the live composition (`making_way.make_way_over`, what the
live boundary asks through `victim_for`), called on the replay's state as plain lists, names the
same waiting job, the same victim and the same way of leaving as the replay, which feeds the
same composition (`making_way.make_way`) from its queues and its victims' heaps."""

from __future__ import annotations

import random

import pytest

from clockq.policy import making_way
from clockq.policy.tiers import TIERS
from clockq.replay import policies
from clockq.replay.clockq_policy import ClockqReplay
from clockq.replay.config import Config
from clockq.replay.model import Trace, TraceJob


class BothWays(ClockqReplay):
    """The replay, checked against the live composition at each of its decisions."""

    name = "clockq-checked"

    def __init__(self, trace, config):
        super().__init__(trace, config)
        self.compared: list[tuple[str, str]] = []  # (the live composition's answer, the replay's)

    def _plain_state(self):
        heads = [  # each tier's own, then each tier's promoted jobs
            q.head(self._share_in(i % self.ranks), self._share_changes[i % self.ranks])[1].standing if q.count else None
            for i, q in enumerate(self.queues)
        ]
        running = [job for job in self.running.values() if job.idx not in self.yielding]
        return heads, running

    def _decide(self, waiting):
        heads, running = self._plain_state()
        live = making_way.make_way_over(
            heads,
            [self._standing(job) for job in running],
            [job.switch_s for job in running],
            free_gpus=self.free,
            held_by_lower=self.held_by_lower,
            total_gpus=self.cfg.gpus,
            freeing_gpus=self.freeing,
            yielding_gpus=self.making_way,
            yielding_lower=self._lower_leaving,
            held_by_promoted=self.held_by_promoted,
            yielding_promoted=self._promoted_leaving,
        )
        found = super()._decide(waiting)
        said_live = "nobody" if live is None else _said(live.waiting.job_id, running[live.victim_index].idx, live)
        said_here = "nobody" if found is None else _said(waiting.job_id, found[0].idx, found[1])
        self.compared.append((said_live, said_here))
        return found


def _said(waiting_idx: int, victim_idx: int, decision: making_way.MakeWay) -> str:
    return f"job {victim_idx} makes way for job {waiting_idx}, {'at once' if decision.interrupt else 'after its slice'}"


def small_trace(seed: int) -> Trace:
    """Jobs of every tier, some of them gangs, arriving faster than 8 GPUs serve them, with
    states of many sizes (so switches cost differently) and three users."""
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(160):
        t += rng.expovariate(1 / 20)
        tier = rng.choice([spec.code for spec in TIERS])
        jobs.append(
            TraceJob(
                key=f"j{i}",
                line=i + 2,
                submit_s=t,
                duration_s=rng.choice((5.0, 60.0, 600.0, 3_000.0)) * rng.uniform(0.5, 1.5),
                num_gpu=rng.choice((1, 1, 1, 2, 4)),
                tier=tier,
                deadline_s=None,
                checkpoint_mb=rng.choice((1.0, 50.0, 800.0)),
                user=rng.choice(("alice", "bob", "carol")),
            )
        )
    return Trace(f"small-{seed}", jobs)


@pytest.mark.parametrize("seed", range(4))
def test_every_decision_of_the_replay_is_the_live_compositions(seed, monkeypatch):
    # Given the replay, checked at every decision, on a trace that keeps 8 GPUs busy
    made: list[BothWays] = []

    class Recorded(BothWays):
        def __init__(self, trace, config):
            super().__init__(trace, config)
            made.append(self)

    monkeypatch.setitem(policies.POLICIES, "clockq-checked", Recorded)
    # Short promotion ticks and batch chances: promoted jobs among those that make way
    config = Config(gpus=8, promotion_tick_s=5, batch_chance_every_s=300)

    # When it runs
    result = policies.replay(small_trace(seed), "clockq-checked", config)

    # Then the live composition said what the replay did, at every one of its decisions
    (checked,) = made
    assert [live for live, _ in checked.compared] == [here for _, here in checked.compared]
    displaced = [here for _, here in checked.compared if here != "nobody"]
    assert len(displaced) >= 10, "the trace should make jobs make way"
    assert any("at once" in d for d in displaced) and any("after its slice" in d for d in displaced)
    assert sum(r.promotions for r in result.jobs) > 0
