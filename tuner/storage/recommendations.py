"""Recommendations as stored in `tuner_recommendations`: saved with their fit and study, read
back as tuner.recommendation.Recommendation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.recommendation import Origin, Recommendation
from tuner.storage.fits import finite
from tuner.storage.orm import Fit, RecommendationRow, Run
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
        rec.origin = rec.origin or _origin(session, rec.fit_id, rec.model)
        row.details = {**row.details, "recommendation_id": row.id}
    return rec.id


def of_row(session: Session, row: RecommendationRow) -> Recommendation:
    rec = Recommendation.from_stored(
        row.id, row.fit_id, row.max_slots, row.n_max, dict(row.details or {})
    )
    rec.origin = _origin(session, row.fit_id, rec.model)
    return rec


def _origin(session: Session, fit_id: int, model: str) -> Origin:
    """How the fit's data were measured: the running servers of its newest run measured by
    `tune --url`, else a spec's launches."""
    fit = session.get(Fit, fit_id)
    run_ids = sorted((fit.inputs or {}).get("runs") or [], reverse=True) if fit else []
    for run_id in run_ids:
        run = session.get(Run, run_id)
        server = ((run.spec or {}).get("server") or {}) if run is not None else {}
        if server.get("url"):
            return Origin(model, str(server["url"]), server.get("plain_url"))
        if run is not None and run.kind != "import":
            break
    return Origin(model)


def origin(store: Store, fit_id: int, model: str) -> Origin:
    with store.session() as session:
        return _origin(session, fit_id, model)


def load(store: Store, rec_id: int) -> Recommendation | None:
    with store.session() as session:
        row = session.get(RecommendationRow, rec_id)
        return of_row(session, row) if row is not None else None


def newest_for_fit(store: Store, fit_id: int) -> Recommendation | None:
    """The newest recommendation made from a fit."""
    with store.session() as session:
        row = session.scalars(
            select(RecommendationRow)
            .where(RecommendationRow.fit_id == fit_id)
            .order_by(RecommendationRow.id.desc())
        ).first()
        return of_row(session, row) if row is not None else None


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
            return of_row(session, row)
    return None
