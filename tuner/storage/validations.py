"""Validation runs as stored: the newest one of a model on a host, what it measured per policy,
and the recommendation it checked (recorded on the run)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select

from tuner.errors import NothingToDoError
from tuner.policy import Policy
from tuner.recommendation import Recommendation
from tuner.storage.orm import COMPLETED, Host, Level, Model, RecommendationRow, Run
from tuner.storage.recommendations import of_row
from tuner.storage.store import Store


def latest_validation(
    store: Store, model: str, host: str | None = None, kind: str = "validate"
) -> int | None:
    """The newest completed validation run (or run of another kind: openloop) of a model, on
    host when one is named."""
    with store.session() as session:
        query = (
            select(Run.id)
            .join(Model)
            .where(Model.name == model, Run.kind == kind, Run.status == COMPLETED)
            .order_by(Run.id.desc())
        )
        if host is not None:
            query = query.join(Host, Run.host_id == Host.id).where(Host.name == host)
        return session.scalars(query).first()


def latest_profile_spec(store: Store, model: str, host: str | None) -> dict[str, Any] | None:
    """The spec (as stored) of the model's newest managed profile run, host's own first."""
    with store.session() as session:
        runs = session.scalars(
            select(Run)
            .join(Model)
            .where(
                Model.name == model,
                Run.kind == "profile",
                Run.source == "measured",
                Run.label.is_(None),
            )
            .order_by(Run.id.desc())
        ).all()
        own = [run.spec for run in runs if run.host is not None and run.host.name == host]
        specs = own or [run.spec for run in runs]
    return dict(specs[0]) if specs else None


def record_checked(store: Store, run_id: int, rec: Recommendation) -> None:
    """Note on a validation run the recommendation it checks and the N it measures as that."""
    with store.session() as session:
        run = session.get(Run, run_id)
        run.recommendation_id, run.validated_max_slots = rec.id, rec.max_slots


def checked_recommendation(store: Store, run_id: int) -> Recommendation:
    """The recommendation a validation run checked, as the run recorded it."""
    with store.session() as session:
        run = session.get(Run, run_id)
        if run is None or run.recommendation_id is None:
            raise NothingToDoError(
                f"validation run {run_id} does not name the recommendation it checked "
                f"(made before tuner recorded it); run `tuner validate` again"
            )
        rec = of_row(session, session.get(RecommendationRow, run.recommendation_id))
        if run.validated_max_slots is not None and run.validated_max_slots != rec.max_slots:
            rec = replace(rec, policy=Policy.of_max_slots(run.validated_max_slots, rec.n_max))
        return rec


def measured_policies(store: Store, run_id: int) -> dict[Policy, dict[int, float]]:
    """tok/s of every completed level of a run, by policy and concurrency."""
    with store.session() as session:
        levels = session.scalars(
            select(Level).where(Level.run_id == run_id, Level.status == COMPLETED)
        ).all()
        table: dict[Policy, dict[int, float]] = {}
        for level in levels:
            if level.policy is not None and level.tokens_per_second is not None:
                table.setdefault(level.policy, {})[level.concurrency] = level.tokens_per_second
    return table


def run_weights(store: Store, run_id: int) -> dict[str, float] | None:
    """The workload weights of a run's spec, if it set any."""
    with store.session() as session:
        spec = session.get(Run, run_id).spec or {}
    weights = (spec.get("workload") or {}).get("weights")
    return {str(k): float(v) for k, v in weights.items()} if weights else None
