"""The recommendation and its reasons: what `tuner recommend` and `tune` make, validation checks,
`watch` applies and the report shows, with its output formats (env, shell, json, systemd,
args). A shared type: storage keeps it, decide makes it, neither owns it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from tuner.jsonout import json_line
from tuner.policy import Policy


class ObjectiveKind(StrEnum):
    """--objective: what the search maximises (tuner.decide.objective scores each)."""

    TPS = "tps"
    TPOT = "tpot"
    CAPACITY = "capacity"


SETTLED, UNRESOLVED, MODEL = "settled", "unresolved", "model"  # Recommendation.status
# Recommendation.kind: serve the model with its draft model at a threshold N, or without it
THRESHOLD, PLAIN = "threshold", "plain"


class ReasonCode(StrEnum):
    """What a reason says, for programs and tests (the text is for people)."""

    PLAIN_EVERYWHERE = "plain-everywhere"  # plain ahead even at 1 stream
    PLAIN_AHEAD = "plain-ahead"  # plain shown ahead of the chosen N: drafting does not pay
    PLAIN_UNRESOLVED = "plain-unresolved"  # plain predicted ahead, not shown: draft at all?
    PLAIN_UNMEASURED = "plain-unmeasured"  # no plain server measured: only the threshold settled
    PLAIN_LIVE = "plain-live"  # beside another answer: draft at all as tune --plain-url measured it
    DISTURBED = "disturbed"  # data measured while others competed for the machine or server
    SPEC_EVERYWHERE = "spec-everywhere"  # spec ahead at every level: N=0
    CROSSOVER = "crossover"  # spec up to N, plain above
    NOISY_GAINS = "noisy-gains"  # measured gains change sign more than once
    MEASUREMENTS_OVERRULE = "measurements-overrule"  # the model's optimum contradicts them
    WITHIN_UNCERTAINTY = "within-uncertainty"  # a smaller N is as good within the noise
    UNMEASURED_N_MAX = "unmeasured-n-max"  # the chosen n_max was not profiled
    UNMEASURED_LEVEL = "unmeasured-level"  # a level the choice rests on was not measured
    MEASURE_NEXT = "measure-next"  # levels the data cannot decide
    OTHER_HOST = "other-host"  # the data are from another host
    LIVE_TRIALS = "live-trials"  # the best of live trials (tuner tune), not the model's pick
    PRUNED = "pruned"  # a live candidate the paired measurements showed cannot win
    SETTLED = "settled"  # every contender's one-sided bound cleared the tolerance live
    TIE = "tie"  # values of N shown equivalent within the tolerance: the smallest chosen
    UNRESOLVED = "unresolved"  # a contender neither shown ahead nor within the tolerance
    TRAFFIC = "traffic"  # the objective is weighted by an observed traffic profile
    # acceptance observed on the traffic stands in for the profile's (or why it does not)
    OBSERVED_ACCEPTANCE = "observed-acceptance"
    OBJECTIVE = "objective"  # an objective other than tps: what it scores and from what
    DERIVED_DEPTH = "derived-depth"  # a context depth (or mix) predicted from other depths
    OPEN_LOOP = "open-loop"  # scored under arrivals in a twin of the fit: what came from where
    DRAFTING_PAYS = "drafting-pays"  # open loop: the chosen N ahead of plain under the traffic
    CLOSED_LOOP = "closed-loop"  # a model without arrival costs: answered from closed levels
    UNCODED = "uncoded"  # stored before reasons had codes


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    text: str

    def __str__(self) -> str:
        return self.text

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "text": self.text}

    @classmethod
    def from_dict(cls, data: dict[str, str] | str) -> Reason:
        if isinstance(data, str):  # stored before reasons had codes
            return cls(ReasonCode.UNCODED, data)
        return cls(ReasonCode(data["code"]), data["text"])


ENV_MAX_SLOTS = "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS"
ENV_N_MAX = "LLAMA_ARG_SPEC_DRAFT_N_MAX"


class OutputFormat(StrEnum):
    """How `tuner recommend` prints its answer."""

    ENV = "env"  # LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS=N, for `>> server.env`
    SHELL = "shell"  # export ..., for eval
    JSON = "json"  # everything, one line
    SYSTEMD = "systemd"  # Environment=..., for a unit file
    ARGS = "args"  # --spec-draft-max-slots N, for a command line
    TEXT = "text"  # the answer and its status in words, one line (Recommendation.headline)


@dataclass(frozen=True)
class Origin:
    """How a model's data were measured, so that every command the tuner suggests about them
    runs: data from a running server (`tune --url`) are measured further there, data from a
    spec by the launches its stored spec describes."""

    model: str
    url: str | None = None  # tune --url: the drafting server measured as it runs
    plain_url: str | None = None  # and the plain server beside it (--plain-url)

    def measure(self) -> str:
        """The command that measures more of these data (tune's pairs add up across runs)."""
        if self.url is None:
            return f"tuner tune --model {self.model}"
        plain = f" --plain-url {self.plain_url}" if self.plain_url else ""
        named = f" --model {self.model}"
        return f"tuner tune --url {self.url}{plain}{named}"

    def as_dict(self) -> dict[str, str | None]:
        return {"model": self.model, "url": self.url, "plain_url": self.plain_url}


@dataclass(frozen=True)
class TableRow:
    """Predicted tok/s at one concurrency: plain, always draft and the chosen policy."""

    concurrency: int
    measured: bool
    plain: float
    spec: float
    chosen: float
    gain_vs_plain: float
    gain_vs_spec: float
    plain_interval: tuple[float, float]
    spec_interval: tuple[float, float]
    # what was measured at this level, in words: "plain", "always draft", "not drafting" (the
    # drafting server at a threshold below the level); empty where nothing was
    measured_as: tuple[str, ...] = ()


@dataclass
class Recommendation:
    """A chosen policy for one model and host, with the fit and study it came from and why."""

    id: int
    model: str
    host: str | None
    policy: Policy  # a drafting policy at an explicit n_max
    fit_id: int
    objective: float | None = None
    objective_interval: tuple[float, float] | None = None
    tune_n_max: bool = False
    min_single_stream: float | None = None
    host_note: str | None = None
    study_name: str = ""
    sampler: str = ""
    trials: int = 0
    reasons: list[Reason] = field(default_factory=list)
    measure_next: list[int] = field(default_factory=list)
    table: list[TableRow] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    made_now: bool = False  # made by the command that shows it (no stored one); not stored
    source: str = "model"  # "model": the cost model's choice; "live": the best live trial
    objective_kind: str = "tps"  # tuner.decide.objective.ObjectiveKind
    objective_text: str | None = None  # the objective as people read it (tpot in ms, ...)
    # Values of N shown equivalent to the best within the tolerance (tuner tune), the answer the
    # smallest of them; empty where no tie was shown.
    tie: list[int] = field(default_factory=list)
    # Plain's objective less this policy's, with one-sided 95 % bounds: (point, low, high); None
    # where not judged.
    plain_advantage: tuple[float, float, float] | None = None
    drafting_pays: bool = True  # False where plain (no draft model) was shown ahead
    # How the data were measured (set where the recommendation is read or saved: the commands
    # it suggests follow it); None: a spec's launches
    origin: Origin | None = None

    def scored(self) -> dict[int, float]:
        """The objective of each N the answer's study scored: the closed-loop study's
        alternatives name N (`max_slots`), the open loop's a policy label; plain has no N."""
        values: dict[int, float] = {}
        for alt in self.alternatives:
            if "max_slots" in alt:
                n = alt["max_slots"]
            else:
                try:
                    n = Policy.parse(str(alt.get("policy", ""))).max_slots
                except ValueError:
                    continue
            if n is not None and alt.get("objective") is not None:
                values[int(n)] = float(alt["objective"])
        return values

    @property
    def max_slots(self) -> int:
        """The threshold N: the answer, or for a plain answer the best threshold should the
        draft model stay."""
        assert self.policy.max_slots is not None
        return self.policy.max_slots

    @property
    def kind(self) -> str:
        """THRESHOLD: serve with the draft model at N; PLAIN: serve without the draft model
        (plain shown ahead of the best threshold)."""
        return THRESHOLD if self.drafting_pays else PLAIN

    @property
    def plain_measured(self) -> bool:
        """Whether plain (the model without a draft model) was measured at all: a running server
        tuned without --plain-url settles the threshold only."""
        return all(r.code is not ReasonCode.PLAIN_UNMEASURED for r in self.reasons)

    @property
    def drafting_verdict(self) -> bool | None:
        """Whether drafting pays at all: False where plain was shown ahead, None where plain
        was not measured (only the threshold is known), True otherwise."""
        if not self.drafting_pays:
            return False
        return True if self.plain_measured else None

    def headline(self) -> str:
        """The answer and its status in one line: what every surface (stdout, tables, report,
        plot, watch's log) states, so that none of them can say another answer."""
        n = f"N={self.max_slots}" + (f", n_max={self.n_max}" if self.tune_n_max else "")
        status = {
            SETTLED: "settled live",
            UNRESOLVED: "unresolved: the best estimate so far",
            MODEL: "the cost model's answer, not settled live",
        }[self.status]
        if self.kind == PLAIN:
            return (
                "plain: serve without the draft model (plain is ahead of the best threshold); "
                f"{n} should the draft model stay ({status})"
            )
        tie = f"; tie {self.tie}, the smallest chosen" if len(self.tie) > 1 else ""
        whether = "" if self.plain_measured else "; whether to draft at all was not measured"
        return f"{n} ({status}{tie}){whether}"

    @property
    def status(self) -> str:
        """settled: live comparisons put every contender behind or within the tolerance, on
        undisturbed data; unresolved: they did not, or the data rest on rounds others disturbed
        (a busy machine, others' requests), or the model names levels it cannot decide; model:
        the cost model's answer, not settled live (`tuner tune` settles it)."""
        codes = {r.code for r in self.reasons}
        if ReasonCode.DISTURBED in codes:
            return UNRESOLVED
        if self.source == "live":
            return SETTLED if ReasonCode.SETTLED in codes else UNRESOLVED
        return UNRESOLVED if self.measure_next else MODEL

    def unresolved_text(self) -> str | None:
        """Why the answer is not settled and what to measure, in one line; None where it is."""
        if self.status != UNRESOLVED:
            return None
        why = next(
            (r.text for r in self.reasons if r.code in (ReasonCode.DISTURBED,)),
            "the comparisons did not settle it"
            if self.source == "live"
            else "the model cannot decide it from the levels measured",
        )
        where = (
            f"; measure next at {', '.join(map(str, sorted(self.measure_next)))} streams"
            if self.measure_next
            else ""
        )
        return (
            f"unresolved: N={self.max_slots} is the best estimate so far, not a settled answer "
            f"({why}){where}: `{self.measure_command}` measures it"
        )

    @property
    def measure_command(self) -> str:
        """The command that measures more of the data this answer rests on."""
        return (self.origin or Origin(self.model)).measure()

    @property
    def n_max(self) -> int | None:
        return self.policy.n_max

    def env(self) -> dict[str, str]:
        out = {ENV_MAX_SLOTS: str(self.max_slots)}
        if self.tune_n_max:
            out[ENV_N_MAX] = str(self.n_max)
        return out

    @property
    def env_line(self) -> str:
        return "\n".join(f"{k}={v}" for k, v in self.env().items())

    def render(self, fmt: OutputFormat | str) -> str:
        """The recommendation in one output format."""
        fmt = OutputFormat(fmt)  # a plain string names a format too; anything else is refused
        if fmt is OutputFormat.JSON:
            return json_line(self.as_dict())
        if fmt is OutputFormat.TEXT:
            return self.headline()
        if fmt is OutputFormat.ARGS:
            if self.kind == PLAIN:
                # the answer is to leave the draft flags out: no threshold flag to add
                return ""
            args = f"--spec-draft-max-slots {self.max_slots}"
            if self.tune_n_max:
                args += f" --spec-draft-n-max {self.n_max}"
            return args
        assigned = {
            OutputFormat.ENV: lambda pairs: "\n".join(f"{k}={v}" for k, v in pairs),
            OutputFormat.SHELL: lambda pairs: "export " + " ".join(f"{k}={v}" for k, v in pairs),
            OutputFormat.SYSTEMD: lambda pairs: (
                "Environment=" + " ".join(f"{k}={v}" for k, v in pairs)
            ),
        }[fmt](self.env().items())
        # env files, shells and units take comment lines: an unresolved answer never reads as
        # a settled one, and a plain answer, which no variable can give (an env file cannot
        # remove --model-draft), is comment lines only
        said = self.unresolved_text()
        if self.kind == PLAIN:
            # every line a comment: with --tune-n-max the pairs span two lines in an env file;
            # the status is the threshold's, should the draft model stay, and where it is
            # unresolved the line that says what to measure comes before it, as it does for a
            # threshold answer
            first, *rest = assigned.splitlines()
            return "\n".join(
                [
                    f"# plain: serve {self.model} without its draft model: remove --model-draft"
                    " (-md) and --spec-type from llama-server's command line (an env file cannot)",
                    *([f"# {said}"] if said else []),
                    f"# should the draft model stay ({self.status}): {first}",
                    *(f"# {line}" for line in rest),
                ]
            )
        return (f"# {said}\n" if said else "") + assigned

    def explain_lines(self) -> list[str]:
        """The head line, the objective and the reasons, one per line."""
        lines = [
            f"recommendation {self.id} for {self.model}: {self.headline()}"
            f" (fit {self.fit_id}, study {self.study_name}, {self.trials} trials)"
        ]
        if self.objective is not None and self.objective_interval is not None:
            lo, hi = self.objective_interval
            if self.objective_kind == "tps":
                lines.append(
                    f"objective: {self.objective:.1f} tok/s workload-weighted [{lo:.1f}, {hi:.1f}]"
                )
            else:
                lines.append(
                    f"objective ({self.objective_kind}): {self.objective_text} "
                    f"(score {self.objective:.4g} [{lo:.4g}, {hi:.4g}])"
                )
        return lines + [f"- {reason}" for reason in self.reasons]

    def as_dict(self) -> dict[str, Any]:
        return {
            "recommendation_id": self.id,
            "model": self.model,
            "host": self.host,
            "max_slots": self.max_slots,
            "n_max": self.n_max,
            "tune_n_max": self.tune_n_max,
            "env": self.env(),
            "fit_id": self.fit_id,
            "objective": self.objective,
            "objective_interval": list(self.objective_interval)
            if self.objective_interval
            else None,
            "min_single_stream": self.min_single_stream,
            "host_note": self.host_note,
            "study_name": self.study_name,
            "sampler": self.sampler,
            "trials": self.trials,
            "reasons": [r.as_dict() for r in self.reasons],
            "measure_next": self.measure_next,
            "table": [asdict(row) for row in self.table],
            "alternatives": self.alternatives,
            "source": self.source,
            "objective_kind": self.objective_kind,
            "objective_text": self.objective_text,
            "tie": self.tie,
            # the kind of answer: "threshold" (max_slots with the draft model) or "plain"
            # (serve without the draft model; max_slots then for a server that keeps it)
            "answer": self.kind,
            "headline": self.headline(),
            # null where plain was never measured (only the threshold was settled)
            "drafting_pays": self.drafting_verdict,
            "measure_command": self.measure_command,
            "plain_advantage": list(self.plain_advantage) if self.plain_advantage else None,
            "status": self.status,
        }

    @classmethod
    def from_stored(
        cls, row_id: int, fit_id: int, max_slots: int, n_max: int | None, details: dict[str, Any]
    ) -> Recommendation:
        """A recommendation as stored (tuner.storage.recommendations)."""
        interval = details.get("objective_interval")
        return cls(
            id=row_id,
            model=str(details.get("model", "")),
            host=details.get("host"),
            policy=Policy.of_max_slots(max_slots, n_max or details.get("n_max")),
            fit_id=fit_id,
            objective=details.get("objective"),
            objective_interval=(
                (float(interval[0]), float(interval[1]))
                if interval and None not in interval
                else None
            ),
            tune_n_max=bool(details.get("tune_n_max")),
            min_single_stream=details.get("min_single_stream"),
            host_note=details.get("host_note"),
            study_name=str(details.get("study_name", "")),
            sampler=str(details.get("sampler", "")),
            trials=int(details.get("trials") or 0),
            reasons=[Reason.from_dict(r) for r in details.get("reasons") or []],
            measure_next=[int(c) for c in details.get("measure_next") or []],
            table=[
                TableRow(
                    **{
                        **row,
                        "plain_interval": tuple(row["plain_interval"]),
                        "spec_interval": tuple(row["spec_interval"]),
                        "measured_as": tuple(row.get("measured_as") or ()),
                    }
                )
                for row in details.get("table") or []
            ],
            alternatives=list(details.get("alternatives") or []),
            source=str(details.get("source", "model")),
            objective_kind=str(details.get("objective_kind") or "tps"),
            objective_text=details.get("objective_text"),
            tie=[int(n) for n in details.get("tie") or []],
            plain_advantage=(
                (float(adv[0]), float(adv[1]), float(adv[2]))
                if (adv := details.get("plain_advantage")) and None not in adv
                else None
            ),
            drafting_pays=details.get("drafting_pays") is not False,
        )
