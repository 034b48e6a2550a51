"""`tuner tune --url`: settle N on a llama-server the tuner did not start and may not restart.

Someone who runs llama-server under systemd, in a container or on a box the tuner must not
restart still has everything the threshold question needs on that one server: the live switch
(`POST /props {"spec_draft_max_slots": N}`) makes it a drafting server at any N, seconds apart.
The path, each step a module of its own:

1. what the server can do for the tuner (measure/doctor, `tuner check`): a server that cannot
   be tuned stops here, with the llama-server flag that fixes each gap;
2. the server held (measure/hold): one tune a server, the threshold it had recorded on the disk
   before the first switch and given back on every way out (a tuner killed outright: the next
   run against the URL gives it back);
3. nobody else using it (measure/foreign): the tune waits up to `wait_s` for a quiet server;
   a round that overlaps others' requests anyway is measured again and left out;
4. the profile, live (decide/adaptive on a measure/backend RunningBackend): always draft and
   the drafting server not drafting (the off arm, threshold c-1 at c) at 1, 2, 4, ... up to
   its slots; plain too where a second server without a draft model is given (`plain_url`);
5. `tuner tune` on the same backend: the same schedule, rules and stopping.

The data are stored under one model name (`model`, else the server's alias, else its model
file's name), so `recommend`, `report` and `watch --model` find them. Without a plain server
the fit lets the off arm stand in for plain (FitData.plain): the threshold is settled and the
answer says that whether to draft at all was not (PLAIN_UNMEASURED). With one slot no
threshold changes anything: only whether to draft at all is asked, where a plain server is
given, side by side at one stream.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.decide import settle
from tuner.decide.adaptive import AdaptiveProfile, profile_adaptively
from tuner.decide.paired import AHEAD, BEHIND, WITHIN, Contrast, verdict
from tuner.decide.tune import TuneReport, plain_gains, tune
from tuner.errors import ConfigError, EndpointMissingError
from tuner.measure import metrics
from tuner.measure.backend import RunningBackend
from tuner.measure.client import LlamaClient, model_name, model_stem
from tuner.measure.doctor import ONE_SLOT, CheckReport, Status, check, spin_finding
from tuner.measure.fingerprint import probe_host
from tuner.measure.foreign import DEFAULT_WAIT_S, wait_for_quiet
from tuner.measure.hold import ServerHold, normalise_url
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.profiler import Context, Profiler
from tuner.measure.spec import ProfileSpec, running_spec
from tuner.policy import Policy
from tuner.storage.store import Store

PROFILE_BUDGET_S = 300.0  # the profile's adaptive levels on a running server


@dataclass(frozen=True)
class RunningOptions:
    """What `tune --url` was asked: the server, the plain server beside it, and the limits."""

    url: str
    api_key: str | None = None
    model: str | None = None  # the name the data are stored under (default: the server's)
    plain_url: str | None = None
    plain_api_key: str | None = None
    wait_s: float = DEFAULT_WAIT_S
    profile_budget_s: float = PROFILE_BUDGET_S
    tune: dict[str, Any] = field(default_factory=dict)  # tune()'s budgets, tolerance, seed
    overrides: list[tuple[str, Any]] | None = None  # --set workload.KEY=VALUE


@dataclass(frozen=True)
class RunningServer:
    """The running server as its GET /props and /metrics show it."""

    url: str
    model: str
    model_path: Path
    slots: int
    n_max: int
    slot_context: int | None


@dataclass(frozen=True)
class PlainAtOne:
    """One slot: plain against always draft at one stream, side by side (plain - drafting)."""

    advantage: Contrast
    verdict: str
    tolerance: float  # tok/s

    def text(self) -> str:
        said = {
            AHEAD: "plain is ahead: serve without the draft model",
            BEHIND: "drafting is ahead: keep the draft model",
            WITHIN: "plain and drafting are within the tolerance of each other",
        }.get(self.verdict, "unresolved: more passes (--set workload.max_repeats=6) narrow it")
        return (
            f"plain against drafting at 1 stream, side by side, one-sided 95 % bounds: "
            f"{self.advantage.figures(confidence=settle.CONFIDENCE)} (tolerance "
            f"+-{self.tolerance:.2f} tok/s): {said}"
        )


@dataclass
class RunningReport:
    """What `tune --url` did: the check, how long it waited, the profile, the tune (or, with
    one slot, plain against drafting), and what it said on the way."""

    server: RunningServer
    check: CheckReport
    waited_s: float = 0.0
    profile: AdaptiveProfile | None = None
    tune: TuneReport | None = None
    one_slot: PlainAtOne | None = None
    notes: list[str] = field(default_factory=list)


def tune_running(
    store: Store,
    options: RunningOptions,
    *,
    host: str,
    state_dir: Path,
    log_dir: Path,
    observer: Observer = quiet,
) -> RunningReport:
    """`tuner tune --url` (see the module docstring)."""
    with ServerHold(options.url, options.api_key, state_dir, observer) as hold:
        # The threshold found goes on the disk right before the check's own switch (a tuner
        # killed then still leaves a record that the next run gives back), and only where the
        # check switches: a server it refuses leaves no record behind.
        checked = check(options.url, options.api_key, observer, before_switch=hold.before_switch)
        if not checked.can_tune:
            raise ConfigError(_cannot_tune(checked))
        server = running_server(checked, options.model, options.api_key)
        report = RunningReport(server, checked)
        if options.plain_url is not None:
            check_plain_server(options.url, options.plain_url, options.plain_api_key, server)
            report.notes += _spinning(options, checked, observer)
        for url, key in _servers(options):
            report.waited_s += wait_for_quiet(url, key, options.wait_s, observer)
        backend = RunningBackend(
            options.url,
            options.api_key,
            switch=hold.switch,
            check=hold.check,
            plain_url=options.plain_url,
            plain_api_key=options.plain_api_key,
        )
        spec = running_spec(
            f"running-{server.model}",
            server.model,
            server.model_path,
            server.slots,
            server.n_max,
            f"tune --url {options.url}",
            options.overrides,
            server.slot_context,
            url=options.url,
            plain_url=options.plain_url,
        )
        if server.slots == 1:
            _one_slot(store, spec, backend, options, report, host, log_dir, observer)
            return report
        report.profile = profile_adaptively(
            store,
            spec,
            log_dir,
            observer,
            host_name=host,
            budget_s=options.profile_budget_s,
            backend=backend,
            plain=options.plain_url is not None,
        )
        observer(ProgressEvent("message", text=report.profile.summary()))
        report.tune = tune(
            store,
            server.model,
            host,
            log_dir,
            observer,
            backend=backend,
            plain_live=options.plain_url is not None,
            overrides=options.overrides,
            **options.tune,
        )
    return report


def _servers(options: RunningOptions) -> list[tuple[str, str | None]]:
    servers = [(options.url, options.api_key)]
    if options.plain_url is not None:
        servers.append((options.plain_url, options.plain_api_key))
    return servers


def _cannot_tune(checked: CheckReport) -> str:
    """Why `tune --url` cannot run, one line a gap with its fix (`tuner check` shows all)."""
    gaps = "; ".join(
        f"{f.name}: {f.seen}" + (f" (fix: {f.fix})" if f.fix else "") for f in checked.failures
    )
    return f"{checked.url} cannot be tuned live: {gaps}; `tuner check --url {checked.url}`"


def running_server(
    checked: CheckReport, model: str | None, api_key: str | None = None
) -> RunningServer:
    """Names and shape from what the check read: the model name the data go under (model,
    else the server's alias, else its model file's stem), slots, draft length, context."""
    props = checked.props or {}
    path = Path(str(props.get("model_path") or "unknown"))
    name = model_stem(model) if model else model_name(props)
    n_max = checked.n_max or _draft_length(checked.url, api_key)
    if n_max is None:
        raise ConfigError(
            f"{checked.url}: its draft length (n_max) did not show in /metrics after a request "
            "that should have drafted; start it with --metrics and a draft model"
        )
    context = (props.get("default_generation_settings") or {}).get("n_ctx")
    return RunningServer(
        checked.url,
        name,
        path,
        int(props.get("total_slots") or 1),
        n_max,
        int(context) if context else None,
    )


def _draft_length(url: str, api_key: str | None) -> int | None:
    """A server that has not drafted yet (one slot: the check ran no rounds) shows no draft
    length in /metrics: one short request that drafts, then the scrape."""
    with LlamaClient(url, api_key) as api:
        api.complete({"prompt": "Count from one to twenty:", "n_predict": 24, "seed": 1})
        return metrics.draft_length(api.metrics())


def _spinning(options: RunningOptions, checked: CheckReport, observer: Observer) -> list[str]:
    """Two servers measured in turn on one machine: where either one's threads spin while it
    is idle, the other's rounds pay for it; said before anything is measured, with the fix."""
    assert options.plain_url is not None
    said = []
    findings = [(options.url, checked.finding("idle CPU")), (options.plain_url, None)]
    for url, finding in findings:
        finding = finding or spin_finding(url)
        if finding is not None and finding.status is Status.WARN:
            said.append(
                f"warning: {url} used {finding.seen}; while the other server is measured it "
                f"counts as another program and its rounds are measured again: {finding.fix}"
            )
    for text in said:
        observer(ProgressEvent("message", text=text))
    return said


def check_plain_server(
    drafting_url: str, url: str, api_key: str | None, drafting: RunningServer
) -> None:
    """The plain server must be another llama-server than the drafting one, of the same model
    without a draft model, with as many slots (else plain against drafting compares two
    different things), and /metrics on (every round reads it)."""
    if normalise_url(url) == normalise_url(drafting_url):
        raise ConfigError(
            f"--plain-url {url} is the drafting server itself (--url): start a second server "
            "of the same model without --model-draft and give its URL"
        )
    with LlamaClient(url, api_key) as api:
        props = api.props()
        slots = api.slots()
        try:
            api.metrics()
        except EndpointMissingError as exc:
            raise ConfigError(f"--plain-url {url}: start it with --metrics too") from exc
    path = Path(str(props.get("model_path") or ""))
    if path.name != drafting.model_path.name:
        raise ConfigError(
            f"--plain-url {url} serves {path.name or 'an unnamed model'}, the drafting server "
            f"{drafting.model_path.name}: plain must be the same model without a draft model"
        )
    if any(s.get("speculative") for s in slots):
        raise ConfigError(
            f"--plain-url {url} has a draft model loaded (/slots: speculative true): start it "
            "without --model-draft"
        )
    total = int(props.get("total_slots") or 1)
    if total < drafting.slots:
        raise ConfigError(
            f"--plain-url {url} has {total} slots, the drafting server {drafting.slots}: give "
            f"it -np {drafting.slots} so both are measured at the same levels"
        )


def _one_slot(
    store: Store,
    spec: ProfileSpec,
    backend: RunningBackend,
    options: RunningOptions,
    report: RunningReport,
    host: str,
    log_dir: Path,
    observer: Observer,
) -> None:
    """One slot: no threshold changes anything. Plain against always draft at one stream, side
    by side, where a plain server is given; said so and nothing measured where not."""
    report.notes.append(ONE_SLOT)
    if options.plain_url is None:
        report.notes.append(
            "nothing measured: give --plain-url URL2 (the same model served without "
            "--model-draft) to ask whether drafting pays at all"
        )
        return
    profiler = Profiler(store, spec, log_dir, observer, backend=backend)
    profiler.create_run(Context(spec.model_name, None, None, probe_host(None, host)))
    always = Policy.always(spec.speculative.n_max)
    profiler.execute([Policy.plain(), always], kernel_level=False)
    rounds = profiler.repeats_by_cell()
    levels = plain_gains(rounds, profiler.level_name(always))
    drafting = [
        float(r["tokens_per_second"])
        for (config, _, _), reps in rounds.items()
        if config == profiler.level_name(always)
        for r in reps
        if r.get("tokens_per_second")
    ]
    tolerance = options.tune.get("tolerance", settle.TOLERANCE) * statistics.fmean(drafting)
    advantage = Contrast.of(levels, {1: 1.0})
    report.one_slot = PlainAtOne(advantage, verdict(advantage, tolerance), tolerance)
