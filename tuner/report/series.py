"""What the report draws, as plain data: the model's curves (plain, always draft, the recommended
policy, each with its interval band), the measured and validation points per policy, and the
crossover. Pure: no database, no files; the figure and the summary are drawn from it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tuner.model.costmodel import CostModel, Crossover
from tuner.policy import Policy
from tuner.recommendation import PLAIN, Recommendation
from tuner.storage.queries import LevelPoint


@dataclass(frozen=True)
class ModelSeries:
    """A policy's predicted tok/s at 1..n_parallel with its interval (a curve and its band)."""

    key: str  # "plain" | "spec" | "policy"
    label: str  # legend text
    policy: Policy
    concurrency: list[int]
    tokens_per_second: list[float]
    lower: list[float]
    upper: list[float]

    def per_stream(self) -> ModelSeries:
        """The same series divided by the number of streams."""
        return replace(
            self,
            tokens_per_second=_per_stream(self.concurrency, self.tokens_per_second),
            lower=_per_stream(self.concurrency, self.lower),
            upper=_per_stream(self.concurrency, self.upper),
        )


@dataclass(frozen=True)
class PointSeries:
    """Measured levels of one candidate: tok/s with an absolute error bar (0 without spread)."""

    key: str  # e.g. "measured plain", "validation N=2"
    label: str  # legend text
    policy: Policy
    validation: bool
    run_ids: tuple[int, ...]
    concurrency: list[int]
    tokens_per_second: list[float]
    error: list[float]

    def per_stream(self) -> PointSeries:
        return replace(
            self,
            tokens_per_second=_per_stream(self.concurrency, self.tokens_per_second),
            error=_per_stream(self.concurrency, self.error),
        )


def _per_stream(concurrency: Sequence[int], values: Sequence[float]) -> list[float]:
    return [v / c for c, v in zip(concurrency, values, strict=True)]


@dataclass(frozen=True)
class ReportData:
    """Everything the figure shows."""

    model: str
    host: str | None
    fit_id: int
    n_parallel: int
    n_max: int
    interval: float
    curves: list[ModelSeries]
    points: list[PointSeries]
    crossover: Crossover
    recommendation: Recommendation

    def curve(self, key: str) -> ModelSeries:
        return next(c for c in self.curves if c.key == key)

    def point_series(self, key: str) -> PointSeries | None:
        return next((p for p in self.points if p.key == key), None)


def group_points(
    points: Iterable[LevelPoint], validation_runs: Iterable[int] = ()
) -> list[PointSeries]:
    """Completed levels by (measured | validation, policy), each sorted by concurrency; levels of
    an attached server (no policy) are left out."""
    validation = set(validation_runs)
    groups: dict[tuple[bool, Policy], list[LevelPoint]] = {}
    for p in points:
        if p.policy is None or p.status != "completed" or not p.tokens_per_second:
            continue
        groups.setdefault((p.run_id in validation, p.policy.with_n_max(None)), []).append(p)
    out = []
    for (is_validation, policy), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1].sort_key)
    ):
        members.sort(key=lambda p: (p.concurrency, p.run_id))
        prefix = "validation" if is_validation else "measured"
        name = "spec (N=0)" if policy.is_always else policy.label
        runs = tuple(sorted({p.run_id for p in members}))
        out.append(
            PointSeries(
                key=f"{prefix} {policy.label}",
                label=f"{prefix}: {name}"
                + (f" (run {', '.join(map(str, runs))})" if is_validation else ""),
                policy=policy,
                validation=is_validation,
                run_ids=runs,
                concurrency=[p.concurrency for p in members],
                tokens_per_second=[float(p.tokens_per_second or 0.0) for p in members],
                error=[
                    float(p.tokens_per_second or 0.0) * float(p.tokens_per_second_spread or 0.0)
                    for p in members
                ],
            )
        )
    return out


def model_series(model: CostModel, key: str, policy: Policy, label: str) -> ModelSeries:
    """`CostModel.predict` of one policy at 1..n_parallel as a series."""
    pred = model.predict(policy)
    return ModelSeries(
        key,
        label,
        policy,
        list(pred.concurrency),
        list(pred.tokens_per_second),
        list(pred.lower),
        list(pred.upper),
    )


def report_data(
    model_name: str,
    host: str | None,
    fit_id: int,
    model: CostModel,
    recommendation: Recommendation,
    points: Iterable[LevelPoint],
    validation_runs: Iterable[int] = (),
) -> ReportData:
    """The series the figure draws: model curves (plain, always draft, the recommended policy),
    measured and validation points, and the crossover. Pure: no database, no files."""
    n_rec = recommendation.n_max if recommendation.n_max in model.n_values() else model.n_max
    policy = recommendation.policy.with_n_max(n_rec)
    # a plain answer's threshold is the best one for a server that keeps its draft model
    policy_label = (
        f"recommended: {policy.label}"
        if recommendation.kind != PLAIN
        else f"if the draft model stays: {policy.label}"
    )
    if n_rec != model.n_max:
        policy_label += f", n_max {n_rec}"
    policy_label += f" ({policy.describe(model.n_parallel)})"
    curves = [
        model_series(
            model,
            "plain",
            Policy.plain(),
            "model: plain (no drafting)"
            if model.plain_measured
            else "model: the drafting server not drafting (plain not measured)",
        ),
        model_series(
            model,
            "spec",
            Policy.always(model.n_max),
            f"model: spec, always draft (N=0, n_max {model.n_max})",
        ),
        model_series(model, "policy", policy, policy_label),
    ]
    return ReportData(
        model=model_name,
        host=host,
        fit_id=fit_id,
        n_parallel=model.n_parallel,
        n_max=model.n_max,
        interval=model.interval,
        curves=curves,
        points=group_points(points, validation_runs),
        crossover=model.crossover(),
        recommendation=recommendation,
    )
