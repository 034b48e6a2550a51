"""How often tune's one-sided 95 % bounds on a comparison miss the truth, where the comparison
sums levels measured in the same passes.

On the twin's bench world (seeded, in-process, noise on), always draft against N=1 at each
level of --levels, --blocks passes a run (A B B A: two pairs a pass, every level in every pass,
stream i drawing the same seed at each level, as tune's passes do), paired and counted as
tune counts them (tune.live_gains: a pass is one block), --runs runs with different seeds.
Each run's comparison is the sum of the levels' gains, its bounds taken two ways: with the
levels as independent (their variances added, Welch's degrees of freedom across them) and as
tune takes them (the covariance of levels over the passes they share, at most the passes less
one degrees of freedom). Two one-sided 95 % bounds should leave the truth outside about 10 %
of the time; the miss count is printed with its 95 % binomial interval.

    .venv/bin/python benchmarks/contrast_coverage.py [--levels 2,3,4] [--blocks 3,6]
        [--runs 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import common  # noqa: F401  (puts tests/ on sys.path)
from record import Table, record_arguments, save_run
from scipy import stats
from twinworlds import truth, world

from tuner.decide.paired import Contrast, LevelDiffs
from tuner.decide.tune import live_gains
from tuner.measure.load import Workload, summarize
from tuner.measure.schedule import PAIRS_PER_PASS
from tuner.policy import Policy
from tuner.twin.inprocess import TwinBackend

EXPECTED = 0.10  # two one-sided 95 % bounds


def one_run(
    backend: TwinBackend, levels: list[int], blocks: int, seed: int
) -> dict[int, LevelDiffs]:
    """One run's gains per level: `blocks` passes, every level in each."""
    on, off = Policy.always(), Policy.threshold(1)
    workload = Workload(prompt_tokens=32, max_tokens=128)
    rounds: dict[tuple[int, str, int], list[dict[str, float | None]]] = {}
    for block in range(blocks):
        for pair in range(2):  # A B, then B A
            key = 10_000 * seed + block * PAIRS_PER_PASS + pair  # a run's own seeds
            order = (on, off) if pair == 0 else (off, on)
            for c in levels:
                for policy in order:
                    measured = backend.measure(policy, (0, c), key, workload)
                    tps = summarize(measured.samples, c).tokens_per_second
                    entry = {"tokens_per_second": tps, "round_key": key}
                    rounds.setdefault((seed, policy.config_name, c), []).append(entry)
    return live_gains(rounds)


def misses(levels: list[int], blocks: int, runs: int) -> tuple[int, int, float, float]:
    """Runs whose two one-sided bounds left the truth outside: levels apart, then together;
    and the mean half-widths of each."""
    w, t = world("bench"), truth("bench")
    gain = sum(t.tps(Policy.always(), c) - t.tps(Policy.threshold(1), c) for c in levels)
    coef = {c: 1.0 for c in levels}
    outside = {"apart": 0, "together": 0}
    widths: dict[str, list[float]] = {"apart": [], "together": []}
    for seed in range(runs):
        gains = one_run(TwinBackend(w, switch="live", seed=seed), levels, blocks, seed)
        taken = {
            "apart": Contrast.of({c: LevelDiffs(g.diffs) for c, g in gains.items()}, coef),
            "together": Contrast.of(gains, coef),
        }
        for how, contrast in taken.items():
            low, high = contrast.bounds(0.95)
            outside[how] += not low <= gain <= high
            widths[how].append(contrast.half_width())
    return (
        outside["apart"],
        outside["together"],
        statistics.fmean(widths["apart"]),
        statistics.fmean(widths["together"]),
    )


def interval(k: int, n: int) -> str:
    """The count's 95 % Clopper-Pearson interval, as shares in %."""
    ci = stats.binomtest(k, n).proportion_ci(0.95)
    return f"{100 * ci.low:.1f}-{100 * ci.high:.1f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="2,3,4", help="the levels summed, comma-separated")
    parser.add_argument("--blocks", default="3,6", help="passes a run, comma-separated")
    parser.add_argument("--runs", type=int, default=200)
    record_arguments(parser)
    args = parser.parse_args()
    levels = [int(c) for c in args.levels.split(",")]
    passes = [int(b) for b in args.blocks.split(",")]
    if not levels or min(levels) < 2 or not passes or not 2 <= min(passes) <= max(passes) <= 9:
        parser.error("--levels: 2 streams or more (N=1 drafts at 1); --blocks: 2 to 9 passes")
    rows = []
    started = time.monotonic()
    for blocks in passes:
        apart, together, w_apart, w_together = misses(levels, blocks, args.runs)
        for how, k, width in (("apart", apart, w_apart), ("together", together, w_together)):
            rows.append([blocks, how, k, args.runs, 100 * k / args.runs, interval(k, args.runs),
                         width])  # fmt: skip
            print(
                f"{blocks} passes, levels {how:<8}: {k} of {args.runs} outside "
                f"({100 * k / args.runs:.1f} %, 95 % {interval(k, args.runs)}; "
                f"{100 * EXPECTED:.0f} % expected), mean half-width {width:.2f} tok/s",
                flush=True,
            )
    print(f"{time.monotonic() - started:.0f} s")
    columns = ["passes", "levels taken", "outside", "runs", "outside %", "95 % interval",
               "half-width tok/s"]  # fmt: skip
    summary = {
        "levels": args.levels,
        "runs": args.runs,
        "expected outside %": 100 * EXPECTED,
        "world": "bench (twin)",
    }
    save_run(__file__, args, summary, [Table("misses by passes", columns, rows)])


if __name__ == "__main__":
    main()
