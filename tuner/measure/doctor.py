"""`tuner check`: what a running llama-server can do for the tuner, and the exact llama-server flag
or key that closes each gap (tuner/cli/check.py renders the report).

`check(url, api_key)` reads GET /props (who answers, whether the API key is taken, the build,
the model, -np, whether the build knows --spec-draft-max-slots, whether --props, --metrics and
--slots are on), scrapes /metrics and /slots, and where the switch can be tried checks it live as
a profile does (measure/switchcheck.check_live_switch: the threshold read back, and the draft
counters following it with 2 streams at threshold 1, then 0; with one slot, the read-back
alone). The threshold it found is set back on every way out and the report says whether that
worked. Nothing else on the server changes: the switch check's rounds are requests like any
client's.

Where it reads what llama-server does not put in GET /props: its default_generation_settings
are a default request's (only the sampling settings copied: "speculative.types" there is "none"
whatever the server drafts, llama-server 11434's get_res_props), so the speculative type comes
from /slots (`speculative` true on every slot where a draft is loaded; a served request's params
carry the server's types) and the draft length n_max from /metrics (the accepted tokens per
draft position, one label a position, once a request that drafted has finished).

Never raises for what the server answers: every problem is a Finding; `can_tune` is whether
`tune --url` can run there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tuner.errors import ApiKeyError, EndpointMissingError, NotLlamaServerError, ServerError
from tuner.measure import interference
from tuner.measure import metrics as drafting
from tuner.measure.client import MAX_SLOTS_FIELD, LlamaClient, model_name
from tuner.measure.hold import recover_left_hold
from tuner.measure.metrics import Metrics
from tuner.measure.plan import Observer, ProgressEvent, quiet
from tuner.measure.switchcheck import CHECK_TOKENS, check_live_switch

PATCH = "patches/spec-draft-max-slots.patch"
PATCH_FIX = f"apply {PATCH} to llama.cpp and rebuild (`tuner bench setup` builds one)"
# llama.cpp 11434 drafts only with a --spec-type: --model-draft alone loads the draft model and
# never drafts (common/arg.cpp --spec-type, default none; tools/server/server-context.cpp
# can_speculate), so a server that shows no drafting may have the draft model loaded already.
DRAFT_FLAGS = (
    "--spec-type draft-simple with --model-draft FILE (this build drafts only with a --spec-type:"
    " --model-draft alone loads the draft model and never drafts); or a --spec-type that needs "
    "no draft model (ngram-*, draft-mtp)"
)
SWITCH_FIX = (
    f"a llama-server built with {PATCH}, started with --props, that nothing else switches meanwhile"
)
# What a server of one slot leaves the tuner: a threshold counts slots generating together.
ONE_SLOT = (
    "1 slot: no threshold changes anything here (N stops drafts only while more than N slots "
    "generate, and here at most one does); tune --url can only ask whether drafting pays at all"
)


class Status(StrEnum):
    """How a finding bears on `tune --url`: fail stops it, the others do not."""

    OK = "ok"
    INFO = "info"
    WARN = "warn"
    SKIP = "skip"  # not tried: what it needs failed on another line
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    """One thing checked: what was seen, and the llama-server flag or key that fixes it."""

    name: str
    status: Status
    seen: str
    fix: str = ""


@dataclass
class CheckReport:
    """What `tuner check` found at a URL, in the order it is shown."""

    url: str
    findings: list[Finding] = field(default_factory=list)
    props: dict[str, Any] | None = None  # GET /props as read before anything was tried
    n_max: int | None = None  # the draft length its /metrics showed (None: not seen)

    def add(self, name: str, status: Status, seen: str, fix: str = "") -> None:
        self.findings.append(Finding(name, status, seen, fix))

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status is Status.FAIL]

    @property
    def can_tune(self) -> bool:
        """Whether `tune --url` can run against this server as it is."""
        return bool(self.findings) and not self.failures

    def finding(self, name: str) -> Finding | None:
        return next((f for f in self.findings if f.name == name), None)


def check(
    url: str,
    api_key: str | None = None,
    observer: Observer = quiet,
    timeout_s: float = 10.0,
    state_dir: Path | None = None,
    before_switch: Callable[[], object] | None = None,
) -> CheckReport:
    """What the server at url can do for the tuner (see the module docstring); with state_dir,
    a threshold a tuner that died left switched there is given back first (measure/hold);
    before_switch runs right before the live switch is tried (`tune --url` records the
    threshold found there), never where the switch is not tried."""
    if state_dir is not None:
        recover_left_hold(url, api_key, state_dir, observer)
    report = CheckReport(url.rstrip("/"))
    with LlamaClient(url, api_key, timeout=timeout_s) as api:
        props = report.props = _who_answers(api, report)
        if props is not None:
            _Checker(api, props, report, observer, before_switch).run()
    return report


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__


def _who_answers(api: LlamaClient, report: CheckReport) -> dict[str, Any] | None:
    """GET /props, or the one finding that says why nothing else can be checked."""
    try:
        props = api.props()
    except ApiKeyError as exc:
        report.add("API key", Status.FAIL, str(exc), "--api-key KEY: the key llama-server took")
        return None
    except NotLlamaServerError as exc:
        report.add("server", Status.FAIL, _not_llama(api, exc), "--url of a llama-server")
        return None
    except ServerError as exc:
        fix = "start llama-server there, or give --url where it listens"
        report.add("server", Status.FAIL, _first_line(exc), fix)
        return None
    twin = " (the tuner's twin)" if isinstance(props.get("twin"), dict) else ""
    report.add("server", Status.OK, f"a llama-server answers GET /props{twin}")
    if api.api_key is None:
        report.add("API key", Status.OK, "none needed")
    else:
        with LlamaClient(api.url, timeout=api.http.timeout) as keyless:
            try:
                keyless.props()
                report.add("API key", Status.OK, "accepted, though the server asks for none")
            except ServerError:
                report.add("API key", Status.OK, "accepted")
    return props


def _not_llama(api: LlamaClient, exc: NotLlamaServerError) -> str:
    """The error, and whether another OpenAI-compatible server answers there instead."""
    try:
        models = api.models()
    except ServerError:
        return str(exc)
    served = ", ".join(models[:3]) or "no model"
    return (
        f"{exc}; GET /v1/models lists {served}: an OpenAI-compatible server, but not llama-server"
    )


class _Checker:
    """Everything after GET /props answered as a llama-server's."""

    def __init__(
        self,
        api: LlamaClient,
        props: dict[str, Any],
        report: CheckReport,
        observer: Observer,
        before_switch: Callable[[], object] | None = None,
    ) -> None:
        self.before_switch = before_switch
        self.api = api
        self.props = props
        self.report = report
        self.observer = observer
        self.slots_total = int(props.get("total_slots") or 0)
        self.before: int | None = props.get(MAX_SLOTS_FIELD)

    def say(self, text: str) -> None:
        self.observer(ProgressEvent("message", text=text))

    def run(self) -> None:
        add = self.report.add
        props = self.props
        add("build", Status.INFO, str(props.get("build_info") or "not reported"))
        path = props.get("model_path")
        add(
            "model",
            Status.INFO,
            f"{model_name(props)} (the name its data go under; {path or '-'})",
        )
        add("-np", Status.INFO, _slots_words(self.slots_total))
        patched = self.before is not None
        if patched:
            add("--spec-draft-max-slots", Status.OK, f"known: {_threshold_words(self.before)}")
        else:
            seen = (
                f"GET /props has no {MAX_SLOTS_FIELD}: this build does not know "
                "--spec-draft-max-slots"
            )
            add("--spec-draft-max-slots", Status.FAIL, seen, PATCH_FIX)
        props_on = props.get("endpoint_props")
        if props_on is False:
            seen = "POST /props is off (endpoint_props false): no threshold can be set live"
            add("--props", Status.FAIL, seen, "--props")
        else:
            add("--props", Status.OK, "on" if props_on else "not reported; tried below")
        scrape = self._metrics()
        slots = self._slots()
        self._idle(scrape)
        loaded = _draft_loaded(slots)
        if not patched or props_on is False:
            add("live switch", Status.SKIP, "not tried: it needs the patch and --props")
        elif loaded is False:
            add("live switch", Status.SKIP, "not tried: no draft model, nothing to switch")
        else:
            self._switch(scrape)
            # What the switch rounds served shows the server's speculative type and n_max.
            scrape = self._quietly(self.api.metrics) if scrape is not None else None
            slots = self._quietly(self.api.slots) if slots is not None else None
        self._speculative(loaded, slots, scrape)

    # -- endpoints --

    def _metrics(self) -> Metrics | None:
        try:
            scrape = self.api.metrics()
        except EndpointMissingError as exc:
            self.report.add("--metrics", Status.FAIL, _endpoint_off(exc), "--metrics")
            return None
        except ServerError as exc:
            self.report.add("--metrics", Status.FAIL, _first_line(exc), "--metrics")
            return None
        self.report.add("--metrics", Status.OK, "on")
        return scrape

    def _slots(self) -> list[dict[str, Any]] | None:
        try:
            slots = self.api.slots()
        except ServerError as exc:
            seen = _endpoint_off(exc) if isinstance(exc, EndpointMissingError) else str(exc)
            seen += " (tune --url does without it; observe and watch fall back on /metrics)"
            self.report.add("--slots", Status.WARN, seen, "--slots (or drop --no-slots)")
            return None
        self.report.add("--slots", Status.OK, "on")
        return slots

    def _idle(self, scrape: Metrics | None) -> None:
        """The server's CPU while it serves nothing, where it runs here (see spin_finding)."""
        if scrape is not None and (scrape.value("llamacpp:requests_processing") or 0) > 0:
            return  # serving someone: its CPU says nothing of idle threads
        if isinstance(self.props.get("twin"), dict):
            return  # the twin runs in virtual time: no threads of its own to watch
        finding = spin_finding(self.api.url)
        if finding is not None:
            self.report.findings.append(finding)

    def _quietly(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except ServerError:
            return None

    # -- the live switch --

    def _switch(self, scrape: Metrics | None) -> None:
        """The switch tried, and the threshold found set back whatever happens meanwhile. With
        one slot no threshold stops a draft, and without /metrics the draft length that bounds
        the drafts in flight is unknown: there it is only read back."""
        assert self.before is not None
        before = self.before
        n_max = drafting.draft_length(scrape) if scrape is not None else None
        problem: str | None = None
        seen = ""
        try:
            if self.before_switch is not None:
                self.before_switch()
            if self.slots_total < 2 or scrape is None:
                other = 0 if before else 1
                self.say(f"live switch: setting {MAX_SLOTS_FIELD} to {other}, then back")
                self.api.set_max_slots(other)
                why = (
                    "n_max unknown without /metrics"
                    if scrape is None
                    else "one slot: no threshold stops a draft"
                )
                seen = (
                    f"POST /props set {MAX_SLOTS_FIELD} to {other} and GET /props read it back "
                    f"(draft counters not watched: {why})"
                )
            else:
                tokens = max(CHECK_TOKENS, 5 * (n_max or 0))
                self.say(
                    f"live switch: 2 streams of {tokens} tokens at threshold 1, then at 0; "
                    f"then back to {before}"
                )
                result = check_live_switch(self.api.url, n_max, api_key=self.api.api_key)
                problem = result.problem
                at_one, at_zero = result.drafted.get(1), result.drafted.get(0)
                seen = (
                    f"reads back, and the draft counters follow it: {at_one} draft tokens while "
                    f"2 streams generated at threshold 1, {at_zero} at 0"
                )
        except ServerError as exc:
            problem = _first_line(exc)
        finally:
            restored = self._restore(before)
        if problem is not None:
            self.report.add("live switch", Status.FAIL, problem, SWITCH_FIX)
        else:
            back = f"; set back to {before}" if restored is None else ""
            self.report.add("live switch", Status.OK, seen + back)
        if restored is not None:
            fix = f'POST /props {{"{MAX_SLOTS_FIELD}": {before}}}, or restart llama-server'
            self.report.add("threshold", Status.FAIL, restored, fix)

    def _restore(self, before: int) -> str | None:
        """Set the threshold found back; None when it reads back, else why not."""
        try:
            self.api.set_max_slots(before)
        except ServerError as exc:
            text = f"could not set {MAX_SLOTS_FIELD} back to {before}: {_first_line(exc)}"
            self.say(text)
            return text
        return None

    # -- what it drafts --

    def _speculative(
        self,
        loaded: bool | None,
        slots: list[dict[str, Any]] | None,
        scrape: Metrics | None,
    ) -> None:
        if loaded is False:
            seen = (
                "not drafting: every slot in /slots says speculative false (no draft model, or "
                "one loaded without --spec-type)"
            )
            self.report.add("speculative", Status.FAIL, seen, DRAFT_FLAGS)
            return
        types = _types(slots or [])
        n_max = self.report.n_max = drafting.draft_length(scrape) if scrape is not None else None
        if n_max is not None:
            length = f"n_max {n_max}"
        elif scrape is None:
            length = "n_max unknown (/metrics shows it)"
        else:
            length = "n_max unknown until it has drafted"
        if types:
            kind = f"type {types}"
        elif loaded:
            kind = "a draft is loaded (its type shows in /slots once a request ran)"
        else:
            kind = "type unknown (/slots shows it)"
        status = Status.OK if loaded or types or n_max else Status.WARN
        self.report.add("speculative", status, f"{kind}, {length}")


def spin_finding(url: str, seconds: float = 1.0) -> Finding | None:
    """Whether the server at url uses the CPU while idle (llama-server's worker threads spin
    between graphs unless started with --poll 0): a warning naming the remedy where it does,
    ok where it does not, None where its process cannot be watched from here."""
    pids, _ = interference.server_pids(url)
    if not pids:
        return None
    cores = interference.idle_cores(pids, seconds)
    if cores < interference.BUSY_CORES:
        return Finding("idle CPU", Status.OK, f"{cores:.2f} cores with no request")
    return Finding(
        "idle CPU",
        Status.WARN,
        f"{cores:.1f} cores with no request: its threads spin between graphs, so a second "
        "server or other programs on this machine and it slow each other",
        interference.SPIN_FIX,
    )


# --- words ----------------------------------------------------------------------------------


def _slots_words(total: int) -> str:
    if total <= 1:
        return ONE_SLOT
    if total == 2:
        return (
            "2 slots: N is 0 (always draft), 1 (draft only while one stream generates) or "
            "plain (no draft model)"
        )
    return f"{total} slots: N from 0 (always draft) to {total - 1}, or plain (no draft model)"


def _threshold_words(n: int) -> str:
    if n == 0:
        return f"{MAX_SLOTS_FIELD} = 0 (no limit: drafts at every concurrency)"
    return f"{MAX_SLOTS_FIELD} = {n} (no new drafts while more than {n} slots generate)"


def _endpoint_off(exc: EndpointMissingError) -> str:
    return f"GET {exc.path} answered HTTP {exc.status}: the endpoint is off"


def _draft_loaded(slots: list[dict[str, Any]] | None) -> bool | None:
    """Whether a draft is loaded, by /slots (None without it)."""
    if not slots:
        return None
    flags = [s.get("speculative") for s in slots if isinstance(s, dict)]
    if not any(isinstance(f, bool) for f in flags):
        return None
    return any(f is True for f in flags)


def _types(slots: list[dict[str, Any]]) -> str:
    """The speculative types a served request carried, without the default "none"."""
    for slot in slots:
        params = slot.get("params") if isinstance(slot, dict) else None
        text = params.get("speculative.types") if isinstance(params, dict) else None
        if isinstance(text, str):
            kinds = [t for t in text.split(",") if t.strip() and t.strip() != "none"]
            if kinds:
                return ",".join(kinds)
    return ""
