"""Traffic profiles in the database: saved while `tuner observe` runs, read by `recommend`."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy import select

from tuner.errors import NotFoundError
from tuner.storage.orm import Traffic, utcnow
from tuner.storage.store import Store
from tuner.traffic import ServerView, TrafficProfile


def default_name(view: ServerView) -> str:
    """host:port/model: a traffic profile is keyed by the server and its model."""
    return f"{server_of(view.url)}/{view.model}"


def server_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else url


def merged(base: TrafficProfile | None, new: TrafficProfile) -> TrafficProfile:
    """An earlier observation under the same name plus this one."""
    return new if base is None else base.plus(new)


def save(store: Store, name: str, view: ServerView, profile: dict, status: str) -> None:
    """Write a traffic profile (as a dict) under its name, creating the row the first time."""
    with store.session() as session:
        row = session.scalars(select(Traffic).where(Traffic.name == name)).first()
        if row is None:
            row = Traffic(
                name=name,
                server=server_of(view.url),
                model=view.model,
                source=view.source,
                n_slots=view.n_slots,
                status=status,
                profile={},
            )
            session.add(row)
        row.profile = profile
        row.n_slots = view.n_slots
        row.status = status
        row.updated_at = utcnow()


def stored_dict(store: Store, name: str) -> dict | None:
    """A traffic profile's row as stored, or None."""
    with store.session() as session:
        row = session.scalars(select(Traffic).where(Traffic.name == name)).first()
        return dict(row.profile) if row is not None else None


class TrafficSaver:
    """save(view, profile, final) for `observe`: one row per name, earlier seconds kept."""

    def __init__(self, store: Store, name: str | None) -> None:
        self.store, self.name = store, name
        self._base: TrafficProfile | None = None
        self._loaded = False

    def __call__(self, view: ServerView, profile: TrafficProfile, final: bool) -> None:
        name = self.name or default_name(view)
        if not self._loaded:
            self._loaded = True
            before = stored_dict(self.store, name)
            if before is not None:
                self._base = TrafficProfile.from_dict(before)
        total = merged(self._base, profile)
        save(self.store, name, view, total.to_dict(), "complete" if final else "observing")
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
