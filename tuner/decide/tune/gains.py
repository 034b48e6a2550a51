"""What the stored rounds of `tuner tune` say: the drafting server's gain g(c) = on(c) - off(c)
per level from paired rounds (live_gains), plain against the answer side by side
(plain_gains), each pair's drafting half scaled to the workload's mean acceptance
(acceptance_pool), one difference per block (a run's pass at a level)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.decide import settle
from tuner.decide.paired import Acceptance, LevelDiffs
from tuner.measure.schedule import PAIRS_PER_PASS
from tuner.policy import Policy, drafts_at, stored_policy

# level -> arm ("on" | "off") -> (run id, round key) -> tok/s
_Rounds = dict[int, dict[str, dict[tuple[int, int], float]]]
# level -> (run id, round key) -> (side, tok/s, mean acceptance its requests drew) of the pair's
# drafting half: side +1 where it is "on", -1 where it is "off" (plain - answer)
_Drew = dict[int, dict[tuple[int, int], tuple[float, float, float]]]
# A level's drafting halves are scaled to the workload's mean acceptance only with this many
# blocks or more: with fewer, the twin's bounds missed the truth more often than they said (3
# blocks: 33 of 200 runs outside two one-sided 95 % bounds, against 20 unscaled), at 8 they did
# not (18 against 17).
MIN_BLOCKS = 6
# Fewer distinct request seeds than this, and nothing is scaled: the anchor's own uncertainty
# would outweigh what scaling takes away (the bench's requests spread 0.45 tokens a step around
# 3.3: 24 seeds leave the mean 2.8 % uncertain).
MIN_SEEDS = 24


def _round_acceptance(r: Mapping[str, Any]) -> float | None:
    """The mean acceptance (tokens a step) of a drafting round's requests, as stored."""
    values = [a for a in r.get("accept_by_stream") or [] if a]
    return sum(values) / len(values) if values else None


def acceptance_pool(rounds: Sequence[Mapping[str, Any]]) -> Acceptance | None:
    """The workload's mean acceptance from drafting rounds' requests (accept_by_stream, stored
    by the profiler where the policy drafted the whole round), one value a request seed (a
    round key's stream: the halves of a pair, and stream i at every level, share it); None
    below MIN_SEEDS seeds."""
    by_seed: dict[tuple[int, int], list[float]] = {}
    for r in rounds:
        if r.get("round_key") is None:
            continue
        for stream, a in enumerate(r.get("accept_by_stream") or []):
            if a:
                by_seed.setdefault((int(r["round_key"]), stream), []).append(float(a))
    values = [statistics.fmean(v) for v in by_seed.values()]
    if len(values) < MIN_SEEDS:
        return None
    mean, var = statistics.fmean(values), statistics.variance(values)
    return Acceptance(mean, var / len(values), len(values))


def _add_round(
    by_level: _Rounds,
    c: int,
    arm: str,
    run_id: int,
    r: Mapping[str, Any],
    drew: _Drew | None = None,
    side: float = 1.0,
) -> None:
    """A stored round as one half of its pair, unless it has no figure of the level: no
    tokens, no round key, apart (no window: the sum of lone streams' rates), or disturbed by
    others (busy, foreign: kept as measured after its third try, profiler). Where `drew`
    is given (the round is the pair's drafting half), the acceptance its requests drew is kept
    there for _block_diffs."""
    if r.get("apart") or r.get("busy") or r.get("foreign"):
        return  # no window; other programs on the machine, or others' requests on the server
    if not r.get("tokens_per_second") or r.get("round_key") is None:
        return
    key = (run_id, int(r["round_key"]))
    tps = float(r["tokens_per_second"])
    by_level.setdefault(c, {}).setdefault(arm, {})[key] = tps
    got = _round_acceptance(r) if drew is not None else None
    if drew is not None and got is not None:
        drew.setdefault(c, {})[key] = (side, tps, got)


def _block_diffs(
    by_level: _Rounds, anchor: Acceptance | None = None, drew: _Drew | None = None
) -> dict[int, LevelDiffs]:
    """on - off per pair, averaged per block (a run's pass at a level): one difference per
    block, its degrees of freedom counted by blocks, each keyed by its block (run, pass) so
    that a contrast over levels of the same passes counts their covariance (Contrast.of).

    With an anchor, at a level of MIN_BLOCKS blocks or more, each pair's drafting half is
    scaled to the anchor's mean acceptance: its tok/s times anchor.mean over the mean its own
    requests drew (tokens a step scale tok/s; what a step costs does not depend on how many
    drafted tokens were accepted), and the level carries its slope (d mean / d anchor.mean)
    for the anchor's own uncertainty (Contrast.of)."""
    out = {}
    for c, pairs in settle.gains_from_rounds(by_level, keyed=True).items():
        here = (drew or {}).get(c, {})
        n_blocks = len({(run_id, key // PAIRS_PER_PASS) for run_id, key in pairs})
        scale = anchor is not None and n_blocks >= MIN_BLOCKS and bool(here)
        blocks: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for (run_id, round_key), diff in pairs.items():
            side, tps, got = here.get((run_id, round_key), (0.0, 0.0, 1.0))
            if scale and anchor is not None and side:
                diff += side * tps * (anchor.mean / got - 1.0)
            slope = side * tps / got if scale else 0.0
            blocks.setdefault((run_id, round_key // PAIRS_PER_PASS), []).append((diff, slope))
        ordered = sorted(blocks.items())
        means = [
            (statistics.fmean(d for d, _ in v), statistics.fmean(s for _, s in v))
            for _, v in ordered
        ]
        slope = statistics.fmean(s for _, s in means) if scale else 0.0
        out[c] = LevelDiffs(
            tuple(d for d, _ in means),
            slope,
            anchor if scale else None,
            blocks=tuple(key for key, _ in ordered),
        )
    return out


def live_gains(
    rounds: Mapping[tuple[int, str, int], Sequence[Mapping[str, Any]]],
) -> dict[int, LevelDiffs]:
    """Paired on - off differences per level from stored rounds keyed (run id, config,
    concurrency): "on" a drafting policy that drafts at the level, "off" a threshold that does
    not. A pair is both halves of one round key (one launch, seconds apart, the same prompts
    and seeds; an "off" round whose server drafted inside the window, drafted_off, is left
    out, and so is a round whose streams never all generated at once, apart); the unit is a
    block, the pairs of one pass at the level (A B B A: two pairs whose off rounds sit side by
    side share a spell, so they are not independent), averaged: one difference per (run, pass),
    its degrees of freedom counted by blocks. Plain is another server and never pairs here.

    The "on" half is scaled to the workload's mean acceptance over every drafting round given
    (acceptance_pool): the off half drafts nothing, so the seeds' luck, which both halves
    share in their prompts but only "on" turns into tokens, would otherwise spread every
    difference (on the bench it made 40-70 % of a block's variance)."""
    by_level: _Rounds = {}
    arms: list[tuple[int, str, int, Mapping[str, Any]]] = []
    for (run_id, config, c), reps in rounds.items():
        policy = stored_policy(config)
        if policy is None or not policy.drafting:
            continue
        arm = "on" if policy.drafts_at(c) else "off"
        for r in reps:
            if arm == "off" and r.get("drafted_off"):
                continue  # the threshold drafted inside the window: not a round of "off"
            arms.append((run_id, arm, c, r))
    anchor = acceptance_pool([r for _, arm, _, r in arms if arm == "on"])
    drew: _Drew = {}
    for run_id, arm, c, r in arms:
        _add_round(by_level, c, arm, run_id, r, drew if arm == "on" else None)
    return _block_diffs(by_level, anchor, drew)


def plain_gains(
    rounds: Mapping[tuple[str, int, int], Sequence[Mapping[str, Any]]],
    answer: str,
    pool: Sequence[Mapping[str, Any]] = (),
) -> dict[int, LevelDiffs]:
    """plain - answer per level from one run's rounds keyed (config, depth, concurrency), plain
    and the answer (its config name) measured side by side: a pair is both halves of one round
    key (the same prompts and seeds, seconds apart), the unit a pass's pairs at the level
    averaged (as in live_gains). Where the answer drafts, its half is scaled to the workload's
    mean acceptance (as in live_gains) over its own drafting rounds and any in `pool` (rounds
    of the same workload elsewhere: more seeds, a surer mean)."""
    drafting = [
        r
        for (config, _, c), reps in rounds.items()
        if config == answer and drafts_at(config, c)
        for r in reps
    ]
    anchor = acceptance_pool([*drafting, *pool])
    by_level: _Rounds = {}
    drew: _Drew = {}
    for (config, _, c), reps in rounds.items():
        arm = "on" if config == Policy.plain().config_name else "off" if config == answer else None
        if arm is None:
            continue
        scaled = arm == "off" and bool(drafts_at(config, c))
        for r in reps:
            _add_round(by_level, c, arm, 0, r, drew if scaled else None, side=-1.0)
    return _block_diffs(by_level, anchor, drew)
