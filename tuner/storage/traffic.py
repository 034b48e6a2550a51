"""Traffic profiles in the database: saved while `tuner observe` runs, read by `recommend`."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy import select

from tuner.errors import NotFoundError
from tuner.measure.observe import ServerView, TrafficProfile
from tuner.storage.engine import Store
from tuner.storage.orm import Traffic, utcnow


def default_name(view: ServerView) -> str:
    """host:port/model: a traffic profile is keyed by the server and its model."""
    return f"{server_of(view.url)}/{view.model}"


def server_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else url


def merged(base: TrafficProfile | None, new: TrafficProfile) -> TrafficProfile:
    """An earlier observation under the same name plus this one."""
    if base is None:
        return new
    seconds = dict(base.seconds)
    for k, v in new.seconds.items():
        seconds[k] = seconds.get(k, 0.0) + v
    return TrafficProfile(
        new.n_slots,
        seconds,
        base.prompt_tokens + new.prompt_tokens,
        base.output_tokens + new.output_tokens,
        base.samples + new.samples,
        new.source,
    )


class TrafficSaver:
    """save(view, profile, final) for `observe`: one row per name, earlier seconds kept."""

    def __init__(self, store: Store, name: str | None) -> None:
        self.store, self.name = store, name
        self._base: TrafficProfile | None = None
        self._loaded = False

    def __call__(self, view: ServerView, profile: TrafficProfile, final: bool) -> None:
        name = self.name or default_name(view)
        with self.store.session() as session:
            row = session.scalars(select(Traffic).where(Traffic.name == name)).first()
            if not self._loaded:
                self._loaded = True
                if row is not None:
                    self._base = TrafficProfile.from_dict(row.profile)
            total = merged(self._base, profile)
            if row is None:
                row = Traffic(
                    name=name,
                    server=server_of(view.url),
                    model=view.model,
                    source=view.source,
                    n_slots=view.n_slots,
                    status="observing",
                    profile={},
                )
                session.add(row)
            row.profile = total.to_dict()
            row.n_slots = view.n_slots
            row.status = "complete" if final else "observing"
            row.updated_at = utcnow()
        self.name = name


def load(store: Store, name: str) -> TrafficProfile:
    with store.session() as session:
        row = session.scalars(select(Traffic).where(Traffic.name == name)).first()
        if row is None:
            known = ", ".join(session.scalars(select(Traffic.name).order_by(Traffic.name)))
            raise NotFoundError(
                f"no traffic profile named {name!r} (known: {known or 'none'}); "
                f"`tuner observe --url URL` learns one"
            )
        return TrafficProfile.from_dict(row.profile)
