"""Open loop on the bench: is the N recommended for a rate's observed traffic the best N there?

1. Profile the bench spec into a fresh database (or use --db) and take the cost model.
2. Pick three Poisson arrival rates that the model says keep about 1.5, 4 and 7 slots generating
   under the standing recommendation (tuner.model.queue.rate_for_mean_generating).
3. Per rate, the standing N serves the arrivals while `observe`'s poller watches /slots: that is
   the rate's observed traffic, stored as a traffic profile. `recommend --traffic` on it gives
   the N for --objective tpot (mean time per output token at the observed arrival rate, each N
   at the occupancy it causes) and for tps (first-order weighting by observed occupancy).
4. Per rate, live, every --spec-draft-max-slots N in 0..np against the recommended one, with the
   same seeded arrivals for --window seconds each:
   - `--design paired` (default): the recommended N and each other N in adjacent runs (R, N0,
     R, N1, R, N2, ...; the order of the others alternates from rate to rate), each N judged
     against the R runs beside it, so a drift of the machine over the minutes of a rate cancels;
     an N that then leads the chosen one is paired again (--confirm times, the order reversed
     each time, at most --confirm-budget extra pairs per rate) and judged on its median pair,
     since the best of several single noisy pairs looks better than it is;
   - `--design sweep`: every N once per pass (--passes, alternating order), medians over passes.

Prints per rate and N: throughput, mean time per output token (mean generating slots /
throughput: the token-weighted mean the tpot objective predicts), p95 TPOT, mean generating slots
beside the queue model's prediction; then the recommended N of each objective, the measured best
N and the recommended N's regret on mean TPOT (target: within 2 %).

    .venv/bin/python benchmarks/openloop.py [--design paired|sweep] [--window 45] [--passes 1]
        [--confirm 2] [--confirm-budget 3] [--db URL] [--seed 0]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import tuner, tuner_env

from tuner.bench import load_bench
from tuner.decide.objective import ObjectiveKind
from tuner.decide.recommend import recommend, standing
from tuner.measure.load import LoadGenerator, Workload
from tuner.measure.observe import Poller
from tuner.measure.openloop import OpenLoopFigures, poisson_offsets, summarize_open_loop
from tuner.measure.profiler import Profiler, gather_context
from tuner.measure.spec import load_spec
from tuner.model import queue
from tuner.model.costmodel import CostModel
from tuner.policy import Policy
from tuner.settings import Settings
from tuner.storage.engine import Store
from tuner.storage.fits import current_fit
from tuner.storage.traffic import TrafficSaver
from tuner.traffic import ServerView, TrafficProfile

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "profiles" / "bench-smollm2-cpu.toml"
MODEL = "smollm2-135m-f32"
TARGETS = (1.5, 4.0, 7.0)


def mean_tpot_ms(f: OpenLoopFigures) -> float:
    return 1000.0 * f.mean_generating / f.tokens_per_second


class Runner:
    """One launch of a policy serving one schedule of arrivals, observed when asked."""

    def __init__(self, profiler: Profiler, workload: Workload) -> None:
        self.profiler, self.workload = profiler, workload
        self.began = time.monotonic()

    def run(
        self, policy: Policy, rate: float, offsets: list[float], key: int, observe: bool = False
    ) -> tuple[OpenLoopFigures, TrafficProfile | None, ServerView | None]:
        seen: TrafficProfile | None = None
        view: ServerView | None = None
        with self.profiler.launched(policy) as server:
            stop = threading.Event()
            watcher = None
            if observe:
                poller = Poller(server.url)
                view = poller.view
                seen = TrafficProfile(view.n_slots)

                def poll(p: Poller = poller, s: TrafficProfile = seen) -> None:
                    while not stop.is_set():
                        p.step(s)

                watcher = threading.Thread(target=poll, daemon=True)
                watcher.start()
            _, samples = LoadGenerator(server.url, self.workload).run_arrivals(offsets, key)
            stop.set()
            if watcher is not None:
                watcher.join()
                poller.close()
        figures = summarize_open_loop(samples, rate)
        print(
            f"  {time.monotonic() - self.began:6.0f} s  N={policy.max_slots}: "
            f"{figures.tokens_per_second:.1f} tok/s, mean TPOT {mean_tpot_ms(figures):.1f} ms, "
            f"{figures.mean_generating:.2f} generating, {figures.failed} failed",
            flush=True,
        )
        return figures, seen, view


def paired(
    runner: Runner,
    chosen: int,
    others: list[int],
    rate: float,
    offsets: list[float],
    key: int,
    args: argparse.Namespace,
    by_n: dict[int, list[OpenLoopFigures]],
) -> dict[int, float]:
    """Each other N in adjacent runs with the chosen one; the median over its pairs of its mean
    TPOT against the chosen N's."""
    pairs: dict[int, list[float]] = {}

    def pair(n: int, chosen_first: bool) -> None:
        runs = [chosen, n] if chosen_first else [n, chosen]
        got = {m: runner.run(Policy.of_max_slots(m), rate, offsets, key)[0] for m in runs}
        for m in runs:
            by_n.setdefault(m, []).append(got[m])
        pairs.setdefault(n, []).append(mean_tpot_ms(got[n]) / mean_tpot_ms(got[chosen]))

    def ratio(n: int) -> float:
        return statistics.median(pairs[n])

    for n in others:
        pair(n, chosen_first=True)
    # The best of eight single pairs is biased towards luck (the winner's curse): the N that
    # leads against the chosen one is measured again, in the other order, until it has
    # 1 + --confirm pairs or another N leads, within --confirm-budget extra pairs.
    for _ in range(args.confirm_budget):
        leader = min(pairs, key=ratio)
        if ratio(leader) >= 1.0 or len(pairs[leader]) > args.confirm:
            break
        pair(leader, chosen_first=len(pairs[leader]) % 2 == 0)
    again = [f"N={n} {len(v)}" for n, v in sorted(pairs.items()) if len(v) > 1]
    print("  pairs: one per N" + (f"; {', '.join(again)}" if again else ""), flush=True)
    return {n: ratio(n) for n in pairs}


def table(cm: CostModel, rate: float, length: float, by_n: dict[int, list[OpenLoopFigures]]):
    print("   N   tok/s  mean TPOT ms  p95 TPOT ms  generating (queue model: generating, TPOT)")
    for n in sorted(by_n):
        fs = by_n[n]
        model_tps = cm.policy_tps(cm.levels, Policy.of_max_slots(n))
        occ = queue.occupancy(model_tps, rate, length)
        print(
            f"  {n:>2} {statistics.median(f.tokens_per_second for f in fs):7.1f} "
            f"{statistics.median(mean_tpot_ms(f) for f in fs):12.1f} "
            f"{statistics.median(f.tpot_ms[1] for f in fs):12.1f} "
            f"{statistics.median(f.mean_generating for f in fs):11.2f} "
            f"({occ.mean_generating:.2f}, {queue.mean_tpot_ms(model_tps, occ):.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--design", choices=("paired", "sweep"), default="paired")
    parser.add_argument("--window", type=float, default=45.0, help="seconds of arrivals per run")
    parser.add_argument("--passes", type=int, default=1, help="sweep: passes per rate (medians)")
    parser.add_argument(
        "--confirm", type=int, default=2, help="paired: extra pairs for an N that leads"
    )
    parser.add_argument(
        "--confirm-budget", type=int, default=3, help="paired: extra pairs per rate at most"
    )
    parser.add_argument("--db", help="a database with a profile of the bench spec already")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-openloop-"))
    env = tuner_env(work / "tuner.db", work / "cache")
    db = args.db or env["TUNER_DB"]
    if not args.db:
        started = time.monotonic()
        tuner(env, "profile", str(SPEC), "--budget", "0")
        print(f"profile: {time.monotonic() - started:.0f} s")
    host = socket.gethostname()
    store = Store(db)
    standing_n = standing(store, MODEL, host)
    cm = current_fit(store, MODEL, host).model
    settings = Settings()
    spec = load_spec(SPEC, [], lambda: load_bench(settings.bench_manifest_path).as_refs())
    length = float(spec.workload.max_tokens)
    tps = cm.policy_tps(cm.levels, standing_n.policy)
    rates = [queue.rate_for_mean_generating(tps, length, m) for m in TARGETS]
    print(
        f"standing N={standing_n.max_slots}; rates for {', '.join(map(str, TARGETS))} slots "
        "generating: " + ", ".join(f"{r:.3f}/s" for r in rates) + f"; design {args.design}",
        flush=True,
    )
    sweep = Store(f"sqlite:///{work / 'sweep.db'}")
    profiler = Profiler(sweep, spec, work / "logs")
    profiler.create_run(gather_context(spec, None), kind="openloop")
    runner = Runner(profiler, profiler.request_workload())
    all_n = list(range(cm.n_parallel + 1))
    for k, rate in enumerate(rates):
        print(f"\nrate {rate:.3f}/s (target {TARGETS[k]} generating)", flush=True)
        offsets = poisson_offsets(rate, args.window, args.seed)
        # The rate's traffic, as observe sees it under the standing N, and the answers for it.
        first, seen, view = runner.run(standing_n.policy, rate, offsets, k, observe=True)
        assert seen is not None and view is not None
        name = f"openloop-{k}"
        TrafficSaver(store, name)(view, seen, True)
        answers = {
            "tpot": recommend(store, MODEL, host, traffic=name, objective=ObjectiveKind.TPOT),
            "tps": recommend(store, MODEL, host, traffic=name),
        }
        chosen = answers["tpot"].max_slots
        print(
            f"  observed {seen.mean_generating():.2f} generating, "
            f"{seen.arrival_rate or 0:.3f} requests/s finished, mean output "
            f"{seen.mean_output_tokens or 0:.0f} tokens: tpot N={chosen}, "
            f"tps N={answers['tps'].max_slots}",
            flush=True,
        )
        by_n: dict[int, list[OpenLoopFigures]] = {standing_n.max_slots: [first]}
        others = [n for n in all_n if n != chosen]
        if k % 2:
            others.reverse()
        # mean TPOT of each other N over that of the chosen N beside it
        if args.design == "paired":
            ratio = paired(runner, chosen, others, rate, offsets, k, args, by_n)
        else:
            for p in range(args.passes):
                order = all_n if (k + p) % 2 == 0 else list(reversed(all_n))
                pass_offsets = poisson_offsets(rate, args.window, args.seed + p)
                for n in order:
                    by_n.setdefault(n, []).append(
                        runner.run(Policy.of_max_slots(n), rate, pass_offsets, k)[0]
                    )
            tpot_of = {n: statistics.median(mean_tpot_ms(f) for f in fs) for n, fs in by_n.items()}
            ratio = {n: tpot_of[n] / tpot_of[chosen] for n in others}
        table(cm, rate, length, by_n)
        best = min(ratio, key=lambda n: ratio[n])
        regret = max(0.0, 1.0 / ratio[best] - 1.0)
        against = ", ".join(f"N={n} {100 * (r - 1):+.1f}%" for n, r in sorted(ratio.items()))
        print(f"  mean TPOT of each N against N={chosen} beside it: {against}")
        print(
            f"  --objective tpot: N={chosen}; measured best N="
            f"{best if ratio[best] < 1 else chosen}; regret on mean TPOT {100 * regret:.2f} % "
            "(target: within 2 %)"
        )
        if answers["tps"].max_slots != chosen:
            tps_n = answers["tps"].max_slots
            print(f"  --objective tps: N={tps_n}, {100 * (ratio[tps_n] - 1):+.1f}% against tpot's")
        print(flush=True)
    print(f"wall time {time.monotonic() - runner.began:.0f} s; files in {work}")


if __name__ == "__main__":
    main()
