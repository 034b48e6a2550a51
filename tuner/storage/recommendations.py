"""Recommendations as stored in `tuner_recommendations`: saved with their fit and study, read
back as tuner.recommendation.Recommendation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from tuner.recommendation import Recommendation
from tuner.storage.fits import finite
from tuner.storage.orm import RecommendationRow
from tuner.storage.store import Store


def save(store: Store, rec: Recommendation, extra: dict[str, Any] | None = None) -> int:
    """Store a recommendation (its id is set on it); extra details go beside its own."""
    with store.session() as session:
        row = RecommendationRow(
            fit_id=rec.fit_id,
            study_name=rec.study_name,
            max_slots=rec.max_slots,
            n_max=rec.n_max,
            objective=rec.objective if rec.objective is not None else float("nan"),
            details=finite(rec.as_dict() | (extra or {})),
        )
        session.add(row)
        session.flush()
        rec.id = row.id
        row.details = {**row.details, "recommendation_id": row.id}
    return rec.id


def of_row(row: RecommendationRow) -> Recommendation:
    return Recommendation.from_stored(
        row.id, row.fit_id, row.max_slots, row.n_max, dict(row.details or {})
    )


def load(store: Store, rec_id: int) -> Recommendation | None:
    with store.session() as session:
        row = session.get(RecommendationRow, rec_id)
        return of_row(row) if row is not None else None


def newest_for_fit(store: Store, fit_id: int) -> Recommendation | None:
    """The newest recommendation made from a fit."""
    with store.session() as session:
        row = session.scalars(
            select(RecommendationRow)
            .where(RecommendationRow.fit_id == fit_id)
            .order_by(RecommendationRow.id.desc())
        ).first()
        return of_row(row) if row is not None else None


def newest_plain_live(store: Store, model: str, host: str | None = None) -> Recommendation | None:
    """The newest answer `tune` stored for the model (on the host, where given) with plain
    measured side by side against it (`tune --plain-url`, `--plain-live`): whether to draft at
    all as the server showed it, its reason first among the answer's."""
    with store.session() as session:
        rows = session.scalars(
            select(RecommendationRow).order_by(RecommendationRow.id.desc()).limit(500)
        ).all()
        for row in rows:
            details = row.details or {}
            tune = details.get("tune") or {}
            if details.get("model") != model or not tune.get("plain_live"):
                continue
            if host is not None and details.get("host") not in (None, host):
                continue
            return of_row(row)
    return None
