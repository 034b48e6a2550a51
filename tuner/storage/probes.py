"""The arrival probes of a run as stored: a level row per probe (its config names the probe, not a
policy, so no curve fits it) whose metrics hold one record per measurement
(tuner.model.arrivals.ProbeRecord), and the closed rounds' time to first token by prompt tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tuner.model.arrivals import ProbeRecord, TtftRound
from tuner.storage.orm import COMPLETED, Level, Run, Sample
from tuner.storage.store import Store

PREFIX = "probe:"  # a probe level's config: probe:catch-up, probe:join


def is_probe(level: Level) -> bool:
    return level.config.startswith(PREFIX)


def has_probes(store: Store, run_id: int) -> bool:
    """Whether the run stored its probes already (a resumed profile does not probe again)."""
    with store.session() as session:
        rows = session.scalars(select(Level.config).where(Level.run_id == run_id)).all()
    return any(config.startswith(PREFIX) for config in rows)


def save_probe(
    store: Store,
    run_id: int,
    kind: str,
    records: Sequence[ProbeRecord],
    *,
    concurrency: int,
    n_max: int | None,
    notes: Sequence[str] = (),
) -> int:
    """One probe's records as a completed level of the run; its id."""
    with store.session() as session:
        level = Level(
            run_id=run_id,
            config=f"{PREFIX}{kind}",
            max_slots=None,
            n_max=n_max,
            concurrency=concurrency,
            context_tokens=0,
            status=COMPLETED,
            repeats=len(records),
            metrics={"repeats": [], "probes": [asdict(r) for r in records], "notes": list(notes)},
        )
        session.add(level)
        session.flush()
        return level.id


def probe_records(level: Level) -> list[ProbeRecord]:
    """A probe level's records (none for any other level)."""
    if not is_probe(level):
        return []
    return [ProbeRecord(**r) for r in (level.metrics or {}).get("probes", [])]


def ttft_rounds(session: Session, levels: Iterable[Level]) -> list[TtftRound]:
    """Every counted round of these levels (plain or drafting policies) with its median time to
    first token and its streams' prompt tokens summed."""
    by_id = {lv.id: lv for lv in levels if lv.policy is not None}
    if not by_id:
        return []
    prompts = {
        (level_id, repeat): int(tokens or 0)
        for level_id, repeat, tokens in session.execute(
            select(Sample.level_id, Sample.repeat, func.sum(Sample.prompt_tokens))
            .where(Sample.level_id.in_(list(by_id)), Sample.ok.is_(True))
            .group_by(Sample.level_id, Sample.repeat)
        )
    }
    out: list[TtftRound] = []
    for level_id, level in by_id.items():
        policy = level.policy
        assert policy is not None
        for entry in (level.metrics or {}).get("repeats", []):
            tokens = prompts.get((level_id, entry.get("repeat")), 0)
            if entry.get("ttft_ms") and tokens > 0:
                out.append(TtftRound(policy.drafting, tokens, float(entry["ttft_ms"])))
    return out


def run_probe_levels(run: Run) -> list[Level]:
    """The run's completed probe levels."""
    return [lv for lv in run.levels if is_probe(lv) and lv.status == COMPLETED]


def mean_output_tokens(store: Store, level_ids: Iterable[int]) -> float | None:
    """The mean tokens the requests of these levels generated (a deep level's are shortened to
    equal time): what the levels' closed rounds were made of."""
    ids = list(level_ids)
    if not ids:
        return None
    with store.session() as session:
        value = session.scalar(
            select(func.avg(Sample.tokens)).where(Sample.level_id.in_(ids), Sample.ok.is_(True))
        )
    return float(value) if value else None
