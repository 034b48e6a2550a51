"""Context depth on the bench: what it costs to profile, how the answer moves, how well the
model predicts a depth it was not fitted on.

In one run, into fresh databases, as a user runs it:
1. the default profile as shipped (`tuner profile profiles/bench-smollm2-cpu.toml`: one depth,
   adaptive levels within the default budget): what a profile costs now;
2. the same spec at one depth and at three (--depths, default 0, 1024, 2048), both with
   `--budget 0` and a context big enough for the deepest, back to back: the cost ratio
   (target: at most 3);
3. from the three-depth profile: the crossover at every depth (`tuner dev fit`) and the recommended
   N at depth 0 and at the deepest (`tuner recommend --context D`);
4. the held-out depth: fits at the other depths predict the middle one (interpolation, the
   model `tuner.model.depth` uses), against every measured repeat there; per point the median
   error over its repeats, then the mean absolute over points (target: at most 8 %); beside it
   the floors that depth's own data sets: the same error for a fit of its own levels, and for
   each repeat predicted by the median of its level's other repeats (the launch-to-launch
   spread no model can beat).

    .venv/bin/python benchmarks/depth.py [--depths 0,1024,2048] [--keep DIR] [--skip-default]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from common import tuner, tuner_env, tuner_run
from record import Table, fmt, record_arguments, save_run

from tuner.model.costmodel import CostModel
from tuner.model.depth import bracket, tps_at_depth
from tuner.model.fitting import fit
from tuner.storage.fits import select_data
from tuner.storage.store import Store

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "profiles" / "bench-smollm2-cpu.toml"


PREFILLED = re.compile(r"prefilled\s+at\s+depth\s+\d+\s+for\s+\d+\s+streams\s+in\s+([\d.]+)\s+s")


def prefill_seconds(progress: str) -> tuple[float, float]:
    """Seconds spent prefilling deep context, from a profile's progress lines: in passes on a
    new launch, and in passes that run on the launch the pass before ended on (where only what
    the last pass's shallower levels truncated is prefilled again)."""
    fresh = shared = 0.0
    on_shared_launch = False
    for line in progress.splitlines():
        if "starting llama-server" in line:
            on_shared_launch = False
        elif "on the same launch" in line:
            on_shared_launch = True
        for seconds in PREFILLED.findall(line):
            if on_shared_launch:
                shared += float(seconds)
            else:
                fresh += float(seconds)
    return fresh, shared


def profiled(
    workdir: Path, name: str, *args: str
) -> tuple[float, tuple[float, float], dict[str, str]]:
    """A profile's wall time, the seconds of it spent prefilling deep context (on new launches,
    on shared ones), and its env."""
    env = tuner_env(workdir / f"{name}.db", workdir / "cache")
    started = time.monotonic()
    result = tuner_run(env, "profile", str(SPEC), *args)
    (workdir / f"{name}.log").write_text(result.stderr)
    return time.monotonic() - started, prefill_seconds(result.stderr), env


@dataclass(frozen=True)
class HeldOut:
    """A held-out depth's prediction error (%), and the floors its own data sets."""

    error: float  # tok/s predicted from the other depths' fits
    step_error: float  # the step time alone (acceptance's randomness taken out)
    own_fit_error: float  # tok/s from a fit of the held-out depth's own levels
    repeat_spread: float  # each repeat against the median of its level's other repeats
    points: int


def percent(fractions: list[float]) -> float:
    """The mean of relative errors, in percent (NaN for none)."""
    return 100 * statistics.fmean(fractions) if fractions else float("nan")


def median_error(predicted: float, measured: list[float]) -> float:
    """The median over repeats of a prediction's relative absolute error."""
    return statistics.median(abs(predicted / m - 1) for m in measured)


def held_out_error(db_url: str, model: str, depths: list[int], held: int) -> HeldOut:
    """How well fits at the other depths predict depth `held`, beside what that depth's own data
    allows: per point the median (over its repeats) absolute error, then the mean over points."""
    store = Store(db_url)
    try:
        models = {
            d: fit(select_data(store, model, None, context=d)[0]).model for d in depths if d != held
        }
        data = select_data(store, model, None, context=held)[0]
    finally:
        store.dispose()
    own = {held: fit(data).model}
    lo, hi = bracket(sorted(models), held)
    share = (held - lo) / (hi - lo)
    errors, step_errors, own_errors, spreads = [], [], [], []
    for level in data.levels:
        if not (level.policy.is_plain or level.policy.is_always) or not level.repeats:
            continue
        policy = level.policy if level.policy.is_plain else level.policy.with_n_max(None)
        c = level.concurrency
        repeats = [r for r in level.repeats if r.tokens_per_second]
        measured = [r.tokens_per_second for r in repeats]
        predicted = float(tps_at_depth(models, policy, [c], held)[0])
        errors.append(median_error(predicted, measured))
        own_errors.append(median_error(float(tps_at_depth(own, policy, [c], held)[0]), measured))
        if len(measured) > 1:
            # Each repeat predicted by the median of the others: the spread no model can beat.
            spreads.append(
                statistics.median(
                    abs(statistics.median(measured[:i] + measured[i + 1 :]) / m - 1)
                    for i, m in enumerate(measured)
                )
            )

        def step(m: CostModel, c: int = c, plain: bool = level.policy.is_plain) -> float:
            return float((m.plain_step if plain else m.spec_step)([c])[0])

        step_pred = step(models[lo]) + share * (step(models[hi]) - step(models[lo]))
        step_errors.append(
            median_error(
                step_pred, [1000 * c * (r.accept_len or 1.0) / r.tokens_per_second for r in repeats]
            )
        )
    return HeldOut(
        percent(errors), percent(step_errors), percent(own_errors), percent(spreads), len(errors)
    )


def crossover_rows(by_depth: dict[str, dict]) -> list[list]:
    """`tuner fit`'s crossover per depth: depth, streams, its interval, and as text."""
    rows: list[list] = []
    for depth, cross in by_depth.items():
        streams = cross["streams"]
        where = (
            f"{streams:.1f} streams [{fmt(cross['lower'], '.1f')}, {fmt(cross['upper'], '.1f')}]"
            if streams is not None
            else "none (plain ahead from 1 stream)"
            if cross["spec_wins_upto"] == 0
            else "none (spec ahead at every level)"
        )
        rows.append([int(depth), streams, cross.get("lower"), cross.get("upper"), where])
    return rows


HELD_COLUMNS = [
    "mean abs error %",
    "step time alone %",
    "own fit %",
    "repeat spread %",
    "points",
]


def held_row(h: HeldOut) -> list:
    return [h.error, h.step_error, h.own_fit_error, h.repeat_spread, h.points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="0,1024,2048", help="three depths, comma-separated")
    parser.add_argument("--keep", type=Path, help="keep the databases and logs here")
    parser.add_argument(
        "--skip-default", action="store_true", help="leave out step 1 (the default profile)"
    )
    record_arguments(parser)
    args = parser.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    model = tomllib.loads(SPEC.read_text())["model_name"]
    spec = tomllib.loads(SPEC.read_text())
    deepest = max(depths) + spec["workload"]["max_tokens"]
    ctx = f"server.ctx_size={deepest * spec['server']['n_parallel']}"
    default_s = None
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if not args.skip_default:
            default_s, _, _ = profiled(workdir, "default")
            print(
                f"default profile (as shipped, adaptive levels included): {default_s:.0f} s",
                flush=True,
            )
        one_s, _, _ = profiled(workdir, "one", "--budget", "0", "--set", ctx)
        print(f"one depth (0), --budget 0: {one_s:.0f} s", flush=True)
        three_s, (fresh_s, shared_s), env = profiled(
            workdir,
            "three",
            "--budget",
            "0",
            "--set",
            ctx,
            "--set",
            f"workload.context_tokens=[{','.join(map(str, depths))}]",
        )
        prefill_s = fresh_s + shared_s
        print(
            f"{len(depths)} depths ({', '.join(map(str, depths))}), --budget 0: {three_s:.0f} s; "
            f"ratio {three_s / one_s:.2f} (target: at most {len(depths)}); of it prefilling "
            f"deep context {prefill_s:.0f} s ({fresh_s:.0f} s on new launches, {shared_s:.0f} s "
            f"on passes sharing a launch; the rest: ratio {(three_s - prefill_s) / one_s:.2f})",
            flush=True,
        )
        fitted = json.loads(tuner(env, "dev", "fit", "--model", model, "--format", "json"))
        crossings = crossover_rows(fitted["crossover_by_depth"])
        for depth, _, _, _, where in crossings:
            print(f"crossover at depth {depth}: {where}")
        recommended = []
        for depth in (depths[0], depths[-1]):
            line = tuner(env, "recommend", "--model", model, "--context", str(depth), "-q")
            print(f"recommended at depth {depth}: {line.strip()}")
            recommended.append([depth, line.strip()])
        held = depths[len(depths) // 2]
        held_out = held_out_error(env["TUNER_DB"], model, depths, held)
        print(
            f"held-out depth {held} predicted from {[d for d in depths if d != held]}: mean "
            f"absolute error {held_out.error:.1f} % over {held_out.points} points (median over "
            f"each point's repeats; target: at most 8 %); of the step time alone "
            f"{held_out.step_error:.1f} %. Floors from depth {held}'s own data: a fit of its own "
            f"levels {held_out.own_fit_error:.1f} %, each repeat against the median of its "
            f"level's others {held_out.repeat_spread:.1f} %"
        )
    summary = {
        "default profile s": default_s,
        "one depth s (--budget 0)": one_s,
        f"{len(depths)} depths s (--budget 0)": three_s,
        "cost ratio (target: at most 3)": three_s / one_s,
        "prefilling deep context s (new launches, shared)": [fresh_s, shared_s],
        "ratio without prefilling": (three_s - prefill_s) / one_s,
        f"held-out depth {held}: mean abs error % (target: at most 8)": held_out.error,
    }
    save_run(
        __file__,
        args,
        summary,
        [
            Table("crossover by depth", ["depth", "streams", "lower", "upper", ""], crossings),
            Table("recommended", ["depth", "tuner recommend -q"], recommended),
            Table(
                f"held-out depth {held}, predicted from {[d for d in depths if d != held]}",
                HELD_COLUMNS,
                [held_row(held_out)],
            ),
        ],
    )


if __name__ == "__main__":
    main()
