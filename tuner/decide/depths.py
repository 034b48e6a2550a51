"""Which context depths an answer is for: `--context` parsed (one depth, or a mix with shares
of time), the profile spec's mix, the depths the data were measured at, and the model of a mix
(or of a depth not measured) derived from the fits at the measured ones."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.model import depth as depth_model
from tuner.model.costmodel import CostModel
from tuner.recommendation import Reason, ReasonCode
from tuner.storage import validations
from tuner.storage.fits import current_fit, select_data
from tuner.storage.store import Store


@dataclass(frozen=True)
class Depths:
    """Which context depths an answer is for: the mix asked for (or the spec's), the depths
    measured, whether the answer is derived from the fits at them (a mix, or a depth not
    measured) and whether interpolated (some depth of the mix not measured)."""

    mix: dict[int, float]
    from_spec: bool
    measured: list[int]
    derived: bool
    interpolated: bool

    @property
    def fit(self) -> int | None:
        """The depth whose fit answers (None: the data's own, or a model derived from fits)."""
        return None if self.derived or not self.mix else next(iter(self.mix))


def depths_for(
    store: Store,
    model: str,
    host: str | None,
    host_explicit: bool,
    context: int | Mapping[int, float] | None,
) -> Depths:
    mix = {context: 1.0} if isinstance(context, int) else dict(context or {})
    from_spec = False
    if not mix:
        mix = spec_depth_mix(store, model, host)
        from_spec = bool(mix)
    depths = measured_depths(store, model, host, host_explicit) if mix else [0]
    derived = bool(mix) and (len(mix) > 1 or next(iter(mix)) not in depths)
    # A mix of measured depths rests on measured levels at each: it stands like any answer.
    # A depth that was not measured is interpolated: printed, never stored.
    interpolated = derived and any(d not in depths for d in mix)
    return Depths(mix, from_spec, depths, derived, interpolated)


def derived_model(
    store: Store, model: str, host: str | None, host_explicit: bool, seed: int, where: Depths
) -> tuple[CostModel, Reason]:
    """The model of a context mix (or a depth not measured), combined from the fits at the
    measured depths, and the reason that says so."""
    mix, depths = where.mix, where.measured
    if len(depths) < 2:
        raise ConfigError(
            f"--context {format_mix(mix)}: model {model!r} was measured at one depth only "
            f"({depths[0]}); a depth it did not measure needs two measured depths to "
            f"interpolate between (`workload.context_tokens`)"
        )
    fits = {
        d: current_fit(store, model, host, host_explicit=host_explicit, seed=seed, context=d)
        for d in depths
    }
    cm = depth_model.mixed({d: f.model for d, f in fits.items()}, mix)
    origin = " (workload.depth_weights of the profile)" if where.from_spec else ""
    return cm, Reason(
        ReasonCode.DERIVED_DEPTH,
        f"context {format_mix(mix)}{origin}: predicted from the fits at depths "
        f"{', '.join(map(str, depths))} (time per token linear in depth between them)"
        + (
            "; no level was measured at some of them, so this answer is not stored"
            if where.interpolated
            else "; each was measured"
        ),
    )


def spec_depth_mix(store: Store, model: str, host: str | None) -> dict[int, float]:
    """workload.depth_weights of the model's newest profile spec ({} when it names none)."""
    spec = validations.latest_profile_spec(store, model, host) or {}
    weights = (spec.get("workload") or {}).get("depth_weights") or {}
    return {int(d): float(w) for d, w in weights.items() if float(w) > 0}


def measured_depths(
    store: Store, model: str, host: str | None, host_explicit: bool = False
) -> list[int]:
    """The context depths the model's current data were measured at."""
    return select_data(store, model, host, host_explicit)[1].depths


def format_mix(mix: Mapping[int, float]) -> str:
    if len(mix) == 1:
        return f"{next(iter(mix))} tokens"
    total = sum(mix.values())
    return ", ".join(f"{d}: {w / total:.0%}" for d, w in sorted(mix.items()))


def parse_context(text: str) -> int | dict[int, float]:
    """`4096` (one depth) or `0:0.5,8192:0.5` (depth: share of time)."""
    try:
        if ":" not in text:
            depth = int(text)
            if depth < 0:
                raise ValueError
            return depth
        mix = {}
        for part in text.split(","):
            d, w = part.split(":")
            mix[int(d)] = float(w)
        if any(d < 0 for d in mix) or any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
            raise ValueError
        return mix
    except ValueError:
        raise ConfigError(
            f"--context {text!r}: expected a depth in tokens (4096) or a mix of depths and "
            "shares (0:0.5,8192:0.5)"
        ) from None
