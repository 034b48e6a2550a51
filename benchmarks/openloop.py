"""Open loop on the bench: is the N recommended for a rate's observed traffic the best N there?

1. Profile the bench spec into a fresh database (or use --db) and take the cost model.
2. Pick three Poisson arrival rates that the model says keep about 1.5, 4 and 7 slots generating
   under the standing recommendation (tuner.model.queue.rate_for_mean_generating).
3. Per rate, in one run and interleaved (N in alternating order from rate to rate): launch every
   --spec-draft-max-slots N in 0..np and send it the same seeded arrivals for --window seconds.
   While the standing N serves them, `observe`'s poller watches /slots: that is the rate's
   observed traffic, stored as a traffic profile.
4. Per rate, `recommend --traffic` on that profile, with --objective tpot (mean time per output
   token at the observed arrival rate, each N at the occupancy it causes) and with tps (the
   first-order weighting by observed occupancy).

Prints, per rate and N: measured throughput, mean time per output token (mean generating slots /
throughput, the token-weighted mean the tpot objective predicts), p95 TPOT and mean generating
slots beside the queue model's prediction of them; then per rate the recommended N of each
objective, the measured best N, and the recommended N's regret on the measured mean TPOT
(target: within 2 %).

    .venv/bin/python benchmarks/openloop.py [--window 90] [--passes 1] [--db URL] [--seed 0]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import fresh_env, tuner

from tuner.bench import load_bench
from tuner.decide.objective import ObjectiveKind
from tuner.decide.recommend import recommend, standing
from tuner.measure.load import LoadGenerator
from tuner.measure.observe import Poller, TrafficProfile
from tuner.measure.openloop import OpenLoopFigures, poisson_offsets, summarize_open_loop
from tuner.measure.profiler import Profiler, gather_context
from tuner.measure.spec import load_spec
from tuner.model import queue
from tuner.policy import Policy
from tuner.settings import Settings
from tuner.storage.engine import Store
from tuner.storage.fits import current_fit
from tuner.storage.traffic import TrafficSaver

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "profiles" / "bench-smollm2-cpu.toml"
MODEL = "smollm2-135m-f32"
TARGETS = (1.5, 4.0, 7.0)


def mean_tpot_ms(f: OpenLoopFigures) -> float:
    return 1000.0 * f.mean_generating / f.tokens_per_second


def observed_while(poller: Poller, stop: threading.Event, profile: TrafficProfile) -> None:
    while not stop.is_set():
        poller.step(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=90.0, help="seconds of arrivals per run")
    parser.add_argument("--db", help="a database with a profile of the bench spec already")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passes", type=int, default=1, help="passes per rate (medians)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-openloop-"))
    env = fresh_env(work / "tuner.db", work / "cache")
    db = args.db or env["TUNER_DB"]
    if not args.db:
        started = time.monotonic()
        tuner(env, "profile", str(SPEC), "--budget", "0")
        print(f"profile: {time.monotonic() - started:.0f} s")
    host = socket.gethostname()
    store = Store(db)
    rec = standing(store, MODEL, host)
    cm = current_fit(store, MODEL, host).model
    settings = Settings()
    spec = load_spec(SPEC, [], lambda: load_bench(settings.bench_manifest_path).as_refs())
    length = float(spec.workload.max_tokens)
    tps = cm.policy_tps(cm.levels, rec.policy)
    rates = [queue.rate_for_mean_generating(tps, length, m) for m in TARGETS]
    print(
        f"standing N={rec.max_slots}; rates for {', '.join(map(str, TARGETS))} slots generating: "
        + ", ".join(f"{r:.3f}/s" for r in rates)
    )
    sweep = Store(f"sqlite:///{work / 'sweep.db'}")
    profiler = Profiler(sweep, spec, work / "logs")
    profiler.create_run(gather_context(spec, None), kind="openloop")
    workload = profiler.request_workload()
    policies = [Policy.of_max_slots(n) for n in range(cm.n_parallel + 1)]
    results: dict[float, dict[int, list[OpenLoopFigures]]] = {}
    began = time.monotonic()
    for k, rate in enumerate(rates):
        traffic = TrafficProfile(cm.n_parallel)
        view = None
        for p in range(args.passes):
            # Each pass its own arrivals; within a pass every N gets the same ones.
            offsets = poisson_offsets(rate, args.window, args.seed + p)
            order = policies if (k + p) % 2 == 0 else list(reversed(policies))
            for policy in order:
                with profiler.launched(policy) as server:
                    stop = threading.Event()
                    watcher = None
                    if policy.max_slots == rec.max_slots:
                        poller = Poller(server.url)
                        view = poller.view
                        seen = TrafficProfile(view.n_slots)
                        watcher = threading.Thread(
                            target=observed_while, args=(poller, stop, seen), daemon=True
                        )
                        watcher.start()
                    _, samples = LoadGenerator(server.url, workload).run_arrivals(offsets, k)
                    stop.set()
                    if watcher is not None:
                        watcher.join()
                        poller.close()
                        traffic = traffic.plus(seen)
                figures = summarize_open_loop(samples, rate)
                results.setdefault(rate, {}).setdefault(policy.max_slots or 0, []).append(figures)
                print(
                    f"  {time.monotonic() - began:6.0f} s  rate {rate:.3f}/s pass {p + 1} "
                    f"N={policy.max_slots}: {figures.tokens_per_second:.1f} tok/s, mean TPOT "
                    f"{mean_tpot_ms(figures):.1f} ms, {figures.mean_generating:.2f} generating, "
                    f"{figures.failed} failed",
                    flush=True,
                )
        name = f"openloop-{k}"
        assert view is not None
        TrafficSaver(store, name)(view, traffic, True)
        by_n = results[rate]
        tpot_of = {n: statistics.median(mean_tpot_ms(f) for f in fs) for n, fs in by_n.items()}
        tpot_rec = recommend(store, MODEL, host, traffic=name, objective=ObjectiveKind.TPOT)
        tps_rec = recommend(store, MODEL, host, traffic=name)
        best = min(tpot_of, key=lambda n: tpot_of[n])
        print(
            f"\nrate {rate:.3f}/s (target {TARGETS[k]} generating): observed "
            f"{traffic.mean_generating():.2f} generating, {traffic.arrival_rate or 0:.3f} "
            f"requests/s finished, mean output {traffic.mean_output_tokens or 0:.0f} tokens"
        )
        print(
            f"   N   tok/s  mean TPOT ms  p95 TPOT ms  generating (queue model)  "
            f"[medians over {args.passes} passes]"
        )
        for n in sorted(by_n):
            fs = by_n[n]
            model_tps = cm.policy_tps(cm.levels, Policy.of_max_slots(n))
            occ = queue.occupancy(model_tps, rate, length)
            print(
                f"  {n:>2} {statistics.median(f.tokens_per_second for f in fs):7.1f} "
                f"{tpot_of[n]:12.1f} {statistics.median(f.tpot_ms[1] for f in fs):12.1f} "
                f"{statistics.median(f.mean_generating for f in fs):11.2f} "
                f"({occ.mean_generating:.2f}, TPOT {queue.mean_tpot_ms(model_tps, occ):.1f})"
            )
        for label, chosen in (("tpot", tpot_rec.max_slots), ("tps", tps_rec.max_slots)):
            regret = tpot_of[chosen] / tpot_of[best] - 1
            print(
                f"  --objective {label}: N={chosen}; measured best N={best}; regret on mean "
                f"TPOT {100 * regret:.2f} % (target: within 2 %)"
            )
        print(flush=True)
    print(f"sweep wall time {time.monotonic() - began:.0f} s; files in {work}")


if __name__ == "__main__":
    main()
