"""Alarms for broken drafting: acceptance by drafting slots held against the floor the fitted
costs set (tuner.model.collapse), said in one line by `check`, `tune`, `observe` and `watch`.

Where the acceptance is read:

- the profile (`profile_collapse`): the accepted tokens a draft at every always-draft level of
  the fit's data (tuner.model.trend's per-level values, with their upper bounds): what `tune`
  says after its answer;
- the server's counters by drafting slots (`observed_collapse`): observe's and watch's
  readings of /metrics, each put at the drafting slots its requests saw
  (TrafficProfile.by_drafting): what `observe` says at its end and `watch` at every interval;
- the server's counters since it started (`lifetime_collapse`): `check` reads /metrics once, so
  the drafting slots are not told apart; it says collapse only where acceptance is below the
  floor at every drafting count (drafting cannot pay at any concurrency: plain protects).

The floor is the fit's for the model (`fit_floors`: the newest fit of the model's data, or the
one the standing answer rests on); without a fit nothing can be said, and the callers say that
instead of an alarm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import ConfigError, NotFoundError, NothingToDoError, ServerError, StorageError
from tuner.measure import doctor
from tuner.measure.client import LlamaClient, model_name
from tuner.measure.doctor import CheckReport, Status
from tuner.measure.metrics import Metrics
from tuner.measure.observe import observe as run_observe
from tuner.measure.plan import Observer, quiet
from tuner.measure.readings import ACCEPTED, DRAFTS
from tuner.model.collapse import (
    MIN_DRAFTS,
    Collapse,
    Floor,
    Seen,
    find_collapse,
    floors,
    seen_in_counts,
    seen_in_profile,
)
from tuner.storage.fits import current_fit, fit_build
from tuner.storage.store import Store
from tuner.traffic import ServerView, TrafficProfile

PROFILE = "the profile"
COUNTERS = "the server's counters"


@dataclass(frozen=True)
class Floors:
    """A fit's floors by drafting slots, the profile's acceptance by level, the build."""

    fit_id: int
    model: str
    floors: dict[int, Floor]
    profile: dict[int, Seen] = field(default_factory=dict)
    build: str = "unknown"

    def text(self) -> str:
        shown = ", ".join(f"{c}: {f.lower:.2f}" for c, f in sorted(self.floors.items()))
        return f"floor by drafting slots (fit {self.fit_id}): {shown}"


def fit_floors(
    store: Store,
    model: str,
    host: str | None = None,
    *,
    host_explicit: bool = False,
    fit_id: int | None = None,
    n_max: int | None = None,
) -> Floors | None:
    """The floors of the model's fit (fit_id, else the newest fit of its data) at draft length
    n_max (the profiled one by default, or where the fit cannot predict it); None where the
    model has no data or its fit knows no acceptance."""
    try:
        fit = current_fit(store, model, host, host_explicit=host_explicit, fit_id=fit_id)
    except (NotFoundError, NothingToDoError, ConfigError):
        return None
    cost = fit.model
    n = n_max if n_max is not None and n_max in cost.n_values() else None
    by_slots = floors(cost, n)
    if not by_slots:
        return None
    trend = cost.trend
    profile = seen_in_profile(trend.per_level, trend.per_level_upper) if trend else {}
    return Floors(fit.id, model, by_slots, profile, fit_build(store, fit.id) or "unknown")


def draft_length(traffic: TrafficProfile) -> int | None:
    """The draft length the server ran while observed: the width of its per-position
    acceptance counters (None without them)."""
    return len(traffic.acceptance.positions) or None


def profile_collapse(floors_: Floors, standing: int | None = None) -> Collapse | None:
    """Collapse in the profile's acceptance by drafting level."""
    return find_collapse(floors_.profile, floors_.floors, PROFILE, floors_.build, standing)


def observed_collapse(
    floors_: Floors, traffic: TrafficProfile, build: str = "", standing: int | None = None
) -> Collapse | None:
    """Collapse in the server's counters by drafting slots (observe's and watch's readings)."""
    seen = seen_in_counts(traffic.by_drafting)
    return find_collapse(seen, floors_.floors, COUNTERS, build or floors_.build, standing)


def lifetime_collapse(
    floors_: Floors, scrape: Metrics, build: str = "", standing: int | None = None
) -> Collapse | None:
    """The server's counters since it started (one scrape): collapse, at one drafting slot,
    only where the acceptance is below the floor at every drafting count."""
    drafts = scrape.value(DRAFTS)
    if drafts < MIN_DRAFTS or not floors_.floors:
        return None
    accepted = scrape.value(ACCEPTED) / drafts
    if any(accepted >= f.lower for f in floors_.floors.values()):
        return None
    source = f"{COUNTERS} since it started (below the floor at every drafting count)"
    return Collapse(1, Seen(1, accepted, None, drafts), floors_.floors[1], source,
                    build or floors_.build, standing)  # fmt: skip


# --- the commands' alarms ----------------------------------------------------------------------


def check_server(
    url: str,
    store: Callable[[], Store],
    host: str,
    api_key: str | None = None,
    observer: Observer = quiet,
    state_dir: Path | None = None,
) -> CheckReport:
    """`tuner check`: the doctor's findings, then the acceptance finding: the server's counters
    since it started against the floor of the model's fit (its alias on this host; `store`
    opens the database only then), in one line."""
    report = doctor.check(url, api_key, observer=observer, state_dir=state_dir)
    props = report.props
    if props is None:
        return report
    alias = model_name(props)
    standing = props.get("spec_draft_max_slots")
    try:
        floors_ = fit_floors(store(), alias, host, n_max=report.n_max) if alias else None
    except (StorageError, ConfigError) as exc:
        report.add("acceptance", Status.WARN, f"no floor read: {exc}")
        return report
    if floors_ is None:
        report.add(
            "acceptance",
            Status.INFO,
            f"no fit of model {alias or '?'} here to hold its acceptance against: "
            f"`tuner tune --url {url}` profiles it",
        )
        return report
    try:
        with LlamaClient(url, api_key) as api:
            scrape = api.metrics()
    except ServerError:
        return report  # the doctor's --metrics line already says why
    build = str(props.get("build_info") or floors_.build)
    collapse = lifetime_collapse(floors_, scrape, build, standing)
    if collapse is not None:
        fix = collapse.answer() if not collapse.protected else ""
        report.add("acceptance", Status.WARN, collapse.line(), fix)
        return report
    drafts = scrape.value(DRAFTS)
    seen = (
        f"{scrape.value(ACCEPTED) / drafts:.3f} accepted tokens a draft over {drafts:.0f} drafts"
        if drafts
        else "nothing drafted yet"
    )
    report.add("acceptance", Status.OK, f"{seen}; {floors_.text()}")
    return report


@dataclass
class Observed:
    """What `tuner observe` returns: the server, the traffic, and the alarm's line (None: the
    acceptance clears the floor, or there is no fit or nothing drafted to hold against it)."""

    view: ServerView
    profile: TrafficProfile
    alarm: str | None = None
    note: str | None = None


def observe_server(
    url: str,
    duration_s: float,
    save: Callable[[ServerView, TrafficProfile, bool], None],
    observer: Observer,
    store: Store,
    host: str,
    *,
    api_key: str | None = None,
    state_dir: Path | None = None,
) -> Observed:
    """`tuner observe`, then the acceptance it saw by drafting slots against the floor of the
    model's fit (the server's alias on this host)."""
    view, profile = run_observe(
        url, duration_s, save, observer, api_key=api_key, state_dir=state_dir
    )
    out = Observed(view, profile)
    try:
        floors_ = fit_floors(store, view.model, host, n_max=draft_length(profile))
    except StorageError as exc:
        out.note = f"acceptance not held against a floor: {exc}"
        return out
    if floors_ is None:
        out.note = (
            f"no fit of model {view.model} here to hold the acceptance seen against: "
            "`tuner tune --url` profiles it"
        )
        return out
    collapse = observed_collapse(floors_, profile, view.build, view.max_slots)
    out.alarm = collapse.line() if collapse is not None else None
    return out


def tune_alarm(
    store: Store, model: str, host: str | None, fit_id: int | None, standing: int | None
) -> str | None:
    """After `tune`: the profile's acceptance by drafting level against its fit's floor."""
    try:
        floors_ = fit_floors(store, model, host, fit_id=fit_id)
    except StorageError:
        return None
    if floors_ is None:
        return None
    collapse = profile_collapse(floors_, standing)
    return collapse.line() if collapse is not None else None
