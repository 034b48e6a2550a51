"""The schedule: which policy measures which cell, in which order, and with which round key.

Pure: it never knows whether a backend relaunches llama-server for every policy, switches one
drafting launch live, or simulates the twin. A backend only says which policies share a launch
(`launch_key`): changing policy inside a launch is cheap (one policy alone, or the live switch),
changing launch is not. The schedule keeps launches few and pairs close:

- Passes: the launch groups take turns, A B then B A, so the group that ends a pass starts the
  next one on the same launch (A, B B, A A, B); every other pass walks the cells backwards, so
  a cell measured early in one pass is measured late in the next, for every group alike, and a
  pass that starts on a kept launch starts at the depth the last one ended at.
- Rounds within a launch: at a cell, the policies of one launch that measure there alternate
  round by round, A B then B A (A B B A over two pairs), so the halves of a pair are seconds
  apart, share the machine's spell, and nothing (launch, load, warm-up) lies between them.

A step's round key names its pair: (pass, pair index). Both halves of a pair get the same key,
so they send the same prompts, output lengths and request seeds; every other pair gets its own.
A policy alone in its launch at a cell (plain; every policy of a relaunching backend) measures
one round per pass, keyed like the first pair of the others: it pairs with them across launches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.policy import Policy

Cell = tuple[int, int]  # (context depth, concurrency): what one level row measures
# What a step measures: a closed level's Cell, or any other key a driver walks in order (the
# open loop walks its arrival schedules by index).
Place = Hashable
PAIRS_PER_PASS = 1000  # round keys: pass * PAIRS_PER_PASS + pair (a pass never holds that many)


@dataclass(frozen=True)
class Step:
    """One round to measure: a policy at a cell, in a pass, as the given pair's half."""

    policy: Policy
    cell: Any  # a Cell for closed levels; a driver's own key otherwise (Place)
    pass_index: int
    pair: int = 0

    @property
    def round_key(self) -> int:
        """What the round's prompts, output lengths and seeds are drawn from."""
        return self.pass_index * PAIRS_PER_PASS + self.pair

    @property
    def depth(self) -> int:
        return self.cell[0]

    @property
    def concurrency(self) -> int:
        return self.cell[1]


Arms = Mapping[Any, Sequence[Policy]]  # the policies that measure at each open cell (Place)


def launch_groups(arms: Arms, launch_key: Callable[[Policy], Hashable]) -> list[Hashable]:
    """The launch keys of the arms, in the order their policies first appear."""
    groups: list[Hashable] = []
    for policies in arms.values():
        for policy in policies:
            key = launch_key(policy)
            if key not in groups:
                groups.append(key)
    return groups


def plan_pass(
    arms: Arms,
    launch_key: Callable[[Policy], Hashable],
    pass_index: int,
    pairs: int = 1,
    done: Callable[[Step], bool] | None = None,
    flip: bool = False,
) -> list[Step]:
    """The steps of one pass, in order (see the module docstring).

    arms: at each open cell (in walking order), the policies that measure there; pairs: pairs
    per pass where a launch holds two or more policies at a cell (the policies alternate A B,
    B A, ...); done: steps already stored (a resumed pass skips them); flip: every pass in the
    other direction (a run whose first pass starts on the launch the backend already has up)."""
    parity = (pass_index + flip) % 2
    backward = parity == 1
    groups = launch_groups(arms, launch_key)
    if backward:
        groups.reverse()
    walk = list(arms)
    if backward:
        walk.reverse()
    steps: list[Step] = []
    for group in groups:
        for cell in walk:
            here = [p for p in arms[cell] if launch_key(p) == group]
            rounds = pairs if len(here) > 1 else 1
            for pair in range(rounds):
                order = here if (parity + pair) % 2 == 0 else here[::-1]
                for policy in order:
                    step = Step(policy, cell, pass_index, pair)
                    if done is None or not done(step):
                        steps.append(step)
    return steps


def launches_of(steps: Sequence[Step], launch_key: Callable[[Policy], Hashable]) -> list[Hashable]:
    """The launch keys in the order a backend meets them (a new entry each time the key
    changes): what a pass costs in launches."""
    out: list[Hashable] = []
    for step in steps:
        key = launch_key(step.policy)
        if not out or out[-1] != key:
            out.append(key)
    return out


def off_arm(concurrency: int) -> Policy | None:
    """A drafting server's policy that does not draft at this concurrency (threshold c-1), or
    None at one stream, where every drafting policy drafts."""
    return Policy.threshold(concurrency - 1) if concurrency > 1 else None


def differ_at(policies: Sequence[Policy], cells: Sequence[Cell]) -> list[Cell]:
    """The cells where the policies' servers behave differently: one drafts and another does
    not, or they draft at different lengths. Elsewhere their difference is zero by
    construction, not a measurement."""

    def behaviour(policy: Policy, c: int) -> tuple[bool, bool, int | None]:
        return (policy.drafting, policy.drafts_at(c), policy.n_max if policy.drafts_at(c) else None)

    return [cell for cell in cells if len({behaviour(p, cell[1]) for p in policies}) > 1]


def policies_of(arms: Arms) -> list[Policy]:
    """The policies of the arms, each once, in the order they first appear."""
    out: list[Policy] = []
    for ps in arms.values():
        for p in ps:
            if p not in out:
                out.append(p)
    return out


def with_off_arms(
    policies: list[Policy], cells: list[Cell], launch_key: Callable[[Policy], Hashable]
) -> dict[Cell, list[Policy]]:
    """Every policy at every cell; where the drafting policies share one launch (a live
    switch), that launch also measures each cell above one stream under a threshold that does
    not draft there (c-1, `off_arm`): what a threshold server does where it does not draft is
    measured, not inferred, and paired with always-draft seconds apart."""
    always = next((p for p in policies if p.is_always), None)
    out: dict[Cell, list[Policy]] = {}
    for cell in cells:
        here = list(policies)
        off = off_arm(cell[1])
        if always is not None and off is not None:
            off = off.with_n_max(always.n_max)
            if off not in here and launch_key(off) == launch_key(always):
                here.append(off)
        out[cell] = here
    return out
