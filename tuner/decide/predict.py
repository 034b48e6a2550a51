"""`tuner predict` and the prediction table every recommendation carries: a policy's predicted
tok/s per concurrency, with plain and always draft beside it and their intervals, from a fit;
what was measured at each level in the words the tables use (`measured_as`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.model.costmodel import CostModel, Crossover, Prediction
from tuner.policy import Policy
from tuner.recommendation import TableRow
from tuner.storage.fits import StoredFit, current_fit
from tuner.storage.store import Store


def prediction_table(
    model: CostModel, policy: Policy, measured: dict[str, list[int]]
) -> list[TableRow]:
    """Per concurrency: plain, always draft and the policy, predicted, with the gains."""
    plain = model.predict(Policy.plain())
    spec = model.predict(Policy.always(policy.n_max))
    chosen = model.predict(policy)
    # the reference a level's gain is read against: plain, or where no plain server was
    # measured the drafting server not drafting there (its stand-in in the fit)
    reference = "plain" if model.plain_measured else "not drafting"
    seen = measured_as(measured)
    both = {c for c, words in seen.items() if "always draft" in words and reference in words}
    return [
        TableRow(
            c,
            c in both,
            plain.tokens_per_second[i],
            spec.tokens_per_second[i],
            chosen.tokens_per_second[i],
            chosen.tokens_per_second[i] / plain.tokens_per_second[i] - 1,
            chosen.tokens_per_second[i] / spec.tokens_per_second[i] - 1,
            (plain.lower[i], plain.upper[i]),
            (spec.lower[i], spec.upper[i]),
            tuple(seen.get(c, ())),
        )
        for i, c in enumerate(plain.concurrency)
    ]


def measured_as(measured: Mapping[str, list[int]]) -> dict[int, list[str]]:
    """What was measured at each level, in the words the tables use: plain (no draft model),
    always draft (a threshold at or above the level drafts there as N=0 does), not drafting
    (a threshold below the level: the drafting server not drafting there)."""
    words = ("plain", "always draft", "not drafting")
    seen: dict[int, set[str]] = {}
    for config, levels in measured.items():
        try:
            policy = Policy.parse(config)
        except ValueError:
            continue  # an attached server's label, or another draft length
        for c in levels:
            if policy.max_slots is None:
                word = words[0]
            else:
                word = words[1] if policy.drafts_at(c) else words[2]
            seen.setdefault(c, set()).add(word)
    return {c: [w for w in words if w in found] for c, found in seen.items()}


@dataclass
class PredictReport:
    """`tuner predict`: a policy's tok/s per concurrency, with plain and always draft beside it."""

    fit: StoredFit
    policy: Policy
    prediction: Prediction
    plain: Prediction
    spec: Prediction
    crossover: Crossover

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.fit.inputs.get("model"),
            "host": self.fit.inputs.get("host"),
            "fit_id": self.fit.id,
            "max_slots": self.policy.max_slots,
            "n_max": self.policy.n_max,
            **self.prediction.to_dict(),
            "plain": self.plain.to_dict(),
            "spec": self.spec.to_dict(),
            "crossover": self.crossover.to_dict(),
            "measured": self.fit.measured,
        }


def _check_n_max(model: CostModel, n_max: int | None) -> int:
    if n_max is None:
        return model.n_max
    if n_max not in model.n_values():
        if model.acceptance.supports_other_n:
            raise ConfigError(
                f"--n-max {n_max}: the fit covers 1..{model.n_max} (the profiled n_max)"
            )
        raise ConfigError(
            f"--n-max {n_max}: this fit has no acceptance data, so only the profiled n_max "
            f"{model.n_max} can be predicted"
        )
    return n_max


def predict(
    store: Store,
    model: str,
    max_slots: int,
    host: str | None,
    *,
    n_max: int | None = None,
    host_explicit: bool = False,
    fit_id: int | None = None,
    context: int | None = None,
) -> PredictReport:
    """Predicted tok/s under --spec-draft-max-slots N (0: always draft) at every concurrency."""
    stored = current_fit(
        store, model, host, host_explicit=host_explicit, fit_id=fit_id, context=context
    )
    cm = stored.model
    if not 0 <= max_slots <= cm.n_parallel:
        raise ConfigError(f"--max-slots {max_slots}: expected 0..{cm.n_parallel} (-np of the fit)")
    n = _check_n_max(cm, n_max)
    policy = Policy.of_max_slots(max_slots, n)
    return PredictReport(
        stored,
        policy,
        cm.predict(policy),
        cm.predict(Policy.plain()),
        cm.predict(Policy.always(n)),
        cm.crossover(n),
    )
