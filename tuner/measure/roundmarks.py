"""What a round is stored with beside its figure, and what others did over it: its requests'
acceptance and the threshold set; the marks that keep it out of tune's pairs (`drafted_off`: a
threshold that must not draft here drafted beyond the drafts in flight; `apart`: its streams
never all generated at once), each with the warning that says so; and the marks of other
programs on the machine (`busy`) or others' requests on the server (`foreign`), which make it
a disturbed round (`Disturbances`, summed up at the command's end); and whether the machine
stalled over a round (`stall_of`: the profiler measures such a round again)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.measure.foreign import foreign_summary
from tuner.measure.interference import RoundLoad, busy_summary
from tuner.measure.load import (
    LevelFigures,
    accept_by_stream,
    drafts_in_flight,
    is_stall,
    never_together,
)
from tuner.measure.plan import Target
from tuner.measure.rounds import Measured
from tuner.measure.schedule import Step
from tuner.measure.stats import slow_stall
from tuner.policy import Policy, drafts_at


class Disturbed(str):
    """Why a round is left out as a stalled one is, where the cause is others: other programs
    on the machine, or others' requests on the server (Disturbances.mark)."""


@dataclass
class Disturbances:
    """The rounds of one command, and those other programs or others' requests disturbed."""

    rounds: int = 0
    busy: list[RoundLoad] = field(default_factory=list)
    foreign: int = 0

    def mark(
        self, measured: Measured, rate: float | None
    ) -> tuple[dict[str, Any], Disturbed | None]:
        """What others did over the round: the marks it is stored with (the machine's load by
        whom; `busy` where other programs competed for the machine, `foreign` where others'
        requests shared the server: tune leaves such rounds out), and why it is disturbed,
        with its figure (None: it was not)."""
        self.rounds += 1
        marks: dict[str, Any] = {}
        why: list[str] = []
        load = measured.machine
        if load is not None:
            marks["machine"] = load.stored()
            if load.busy:
                marks["busy"] = True
                why.append(load.why())
                self.busy.append(load)
        if measured.foreign is not None:
            marks["foreign"] = measured.foreign.stored()
            why.append(measured.foreign.why())
            self.foreign += 1
        if not why:
            return marks, None
        figure = f"{rate:.1f} tok/s" if rate else "its figure"
        return marks, Disturbed(f"{figure} while {'; and '.join(why)}")

    def summary(self) -> list[str]:
        """The command's rounds that others disturbed, in words, at its end."""
        texts = (busy_summary(self.busy, self.rounds), foreign_summary(self.foreign, self.rounds))
        return [text for text in texts if text is not None]


def round_marks(
    policy: Target,
    concurrency: int,
    measured: Measured,
    figures: LevelFigures,
    n_max: int,
    name: str,
) -> tuple[dict[str, Any], list[str]]:
    """What a round is stored with beside its figure (its requests' acceptance where it
    drafts, the threshold set, the marks that keep it out of tune's pairs) and the warnings
    that say so; n_max: the spec's draft length, name: the level's (the recorder's)."""
    extra: dict[str, Any] = {}
    warnings: list[str] = []
    if isinstance(policy, Policy) and policy.drafting and policy.drafts_at(concurrency):
        # each request's tokens a step: a function of its seed alone, so tune can scale the
        # round to the workload's mean acceptance (tune.live_gains)
        extra["accept_by_stream"] = accept_by_stream(measured.samples, concurrency)
    if measured.max_slots is not None:
        extra["max_slots_set"] = measured.max_slots
    warning = drafted_off(policy, concurrency, figures.window_drafted, n_max, name)
    if warning is not None:
        extra["drafted_off"] = True  # the count is the round's window_drafted
        warnings.append(warning)
    if never_together(measured.samples, concurrency):
        extra["apart"] = True
        warnings.append(
            f"warning: {name} at {concurrency} streams: the streams never all "
            "generated at once (one started after another had finished), so the round's figure "
            "is the sum of the streams' own rates; live comparisons leave it out"
        )
    return extra, warnings


def drafted_off(
    policy: Target, concurrency: int, drafted: int | None, n_max: int, name: str
) -> str | None:
    """A warning where a threshold that must not draft at this level drafted inside the
    measured window beyond one draft in flight per stream (the server did not follow its
    threshold); None where it did, or where the round cannot tell."""
    if drafted is None or not isinstance(policy, Policy):
        return None
    if not policy.drafting or policy.drafts_at(concurrency):
        return None  # plain, or a policy that drafts here: nothing to check
    in_flight = drafts_in_flight(concurrency, policy.n_max or n_max)
    if drafted <= in_flight:
        return None
    return (
        f"warning: {name} drafted {drafted} tokens inside the measured window at "
        f"{concurrency} streams, where its threshold starts no draft (at most {in_flight} in "
        "flight): this round does not measure it, and live comparisons leave it out"
    )


def stall_of(
    name: str,
    step: Step,
    paused: tuple[float, float] | None,
    rate: float | None,
    repeats: dict[tuple[str, int, int], list[dict[str, Any]]],
) -> tuple[str | None, dict[str, str]]:
    """Why a round (of level `name`, measured at `rate` tok/s) is a stall of the machine, or
    None: a pause in its window (load.is_stall), or its tok/s far below its level's or its
    pair's (stats.slow_stall; the pair's halves compared only where both draft or neither does:
    drafting can outrun plain several times over at one stream). repeats: the run's counted
    rounds at the step's cell, by (config, depth, concurrency). Where it is no stall, the other
    halves of its pair measured before it and far slower than it, by config, with why: they are
    the stalls."""
    if paused is not None and is_stall(*paused):
        pause, window = paused
        return f"no stream got a token for {pause:.1f} s of the round's {window:.1f} s window", {}
    concurrency = step.concurrency
    drafting = drafts_at(name, concurrency)
    own: list[float] = []
    partners: dict[str, float] = {}
    for (config, _, _), reps in repeats.items():
        for r in reps:
            if not r.get("tokens_per_second"):
                continue
            if config == name:
                own.append(r["tokens_per_second"])
            elif r.get("round_key") == step.round_key and (
                drafts_at(config, concurrency) == drafting
            ):
                partners[config] = r["tokens_per_second"]
    slow = slow_stall(rate, own, list(partners.values()))
    if slow is not None:
        return slow, {}
    earlier: dict[str, str] = {}
    for config, other in partners.items():
        why = slow_stall(other, [], [rate] if rate else [])
        if why is not None:
            earlier[config] = why
    return None, earlier
