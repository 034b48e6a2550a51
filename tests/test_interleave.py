"""The schedule (measure/schedule.py): which policy measures which cell in which order, on which
launch, with which round key. Pure: the same plan drives a relaunching server, a live switch
and the twin (the live tests in test_profile and test_depth run it on the bench)."""

from __future__ import annotations

from collections.abc import Hashable

from tuner.measure.schedule import Cell, Step, differ_at, launches_of, off_arm, plan_pass
from tuner.policy import Policy

CELLS: list[Cell] = [(0, 1), (0, 8), (1024, 1), (1024, 8), (2048, 1), (2048, 8)]
PLAIN, SPEC = Policy.plain(), Policy.always()


def relaunch(policy: Policy) -> Hashable:
    """Every policy its own launch."""
    return policy.config_name


def live(policy: Policy) -> Hashable:
    """Drafting policies share one launch (the live switch); plain has its own."""
    return "drafting" if policy.drafting else "plain"


def passes(arms, key, n: int) -> list[list[Step]]:
    return [plan_pass(arms, key, p) for p in range(n)]


def test_passes_share_launches_and_alternate_the_walk() -> None:
    arms = {cell: [PLAIN, SPEC] for cell in CELLS}
    plan = passes(arms, relaunch, 3)
    steps = [s for p in plan for s in p]

    # A, B B, A A, B: the policy that ends a pass starts the next on its launch.
    assert launches_of(steps, relaunch) == ["plain", "spec", "plain", "spec"]
    for p, pass_steps in enumerate(plan):
        for policy in (PLAIN, SPEC):
            walk = [s.cell for s in pass_steps if s.policy == policy]
            # Both policies walk a pass the same way, every other pass backwards.
            assert walk == (CELLS if p % 2 == 0 else CELLS[::-1]), (policy, p)
    # The second pass on a shared launch starts where the first one ended.
    assert plan[0][-1].cell == plan[1][0].cell == (2048, 8)


def test_stored_steps_leave_the_walk() -> None:
    """A resumed pass measures only what its policy has not measured in it yet."""
    arms = {cell: [PLAIN, SPEC] for cell in CELLS}
    first = plan_pass(arms, relaunch, 0, done=lambda s: s == Step(PLAIN, (0, 1), 0))
    assert Step(PLAIN, (0, 1), 0) not in first
    assert Step(SPEC, (0, 1), 0) in first
    assert len(first) == 2 * len(CELLS) - 1


def test_live_switch_alternates_round_by_round_at_a_cell() -> None:
    """On one drafting launch the arms of a cell alternate A B, B A: pairs share seconds, and a
    pair's halves share its round key (its prompts and seeds); plain keeps its own launch."""
    cells = [(0, 2), (0, 4)]
    arms = {cell: [PLAIN, SPEC, off_arm(cell[1])] for cell in cells}
    plan = plan_pass(arms, live, 0, pairs=2)
    drafting = [s for s in plan if s.policy.drafting]
    at_4 = [s for s in drafting if s.cell == (0, 4)]
    assert [s.policy.label for s in at_4] == ["N=0", "N=3", "N=3", "N=0"]  # A B B A
    assert [s.pair for s in at_4] == [0, 0, 1, 1]
    assert at_4[0].round_key == at_4[1].round_key != at_4[2].round_key == at_4[3].round_key
    # one launch for plain, one for every drafting policy
    assert launches_of(plan, live) == ["plain", "drafting"]
    # plain measures once per cell per pass, keyed like the first pair: it pairs across launches
    assert [s.round_key for s in plan if s.policy == PLAIN] == [at_4[0].round_key] * 2
    # the next pass starts on the drafting launch, B A first
    nxt = plan_pass(arms, live, 1, pairs=2)
    assert launches_of(nxt, live) == ["drafting", "plain"]
    assert [s.policy.label for s in nxt if s.cell == (0, 4)][:2] == ["N=3", "N=0"]


def test_round_keys_differ_from_pair_to_pair_and_pass_to_pass() -> None:
    arms = {(0, 4): [SPEC, Policy.threshold(3)]}
    keys = {
        (s.pass_index, s.pair): s.round_key
        for p in range(3)
        for s in plan_pass(arms, live, p, pairs=2)
    }
    assert len(set(keys.values())) == len(keys) == 6


def test_policies_differ_only_where_one_drafts_and_the_other_does_not() -> None:
    cells = [(0, c) for c in range(1, 9)]
    n2, n3 = Policy.threshold(2), Policy.threshold(3)
    assert differ_at([n2, n3], cells) == [(0, 3)]
    assert differ_at([SPEC, Policy.threshold(8)], cells) == []  # the same server at -np 8
    assert differ_at([SPEC, n3], cells) == [(0, c) for c in range(4, 9)]
    # plain is another server: it differs from a threshold everywhere, drafting or not
    assert differ_at([PLAIN, n3], cells) == cells
    assert off_arm(1) is None and off_arm(5) == Policy.threshold(4)
