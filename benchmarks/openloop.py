"""Open loop on the bench: is the N recommended for a rate's observed traffic shown no more than
3 % behind its contenders, judged the way tune judges closed levels?

1. Profile and tune the bench spec into a fresh database (or use --db): the standing N.
2. Three Poisson arrival rates that the cost model says keep about 1.5, 4 and 7 slots generating
   under the standing N (tuner.model.queue.rate_for_mean_generating).
3. Per rate, the standing N serves the arrivals on one drafting launch while `observe`'s poller
   watches /slots: the rate's observed traffic, stored as a traffic profile; `recommend
   --traffic NAME --objective tpot` gives the answer for it.
4. The answer against N-1, N+1 and always draft, on the same principle as tune: one drafting
   launch, the threshold switched live between rounds (the server idle in between), A B B A
   blocks in which both halves of a pair serve the same seeded arrivals with the same request
   seeds (another draw per block). A block's value is the contender's mean time per output
   token (mean generating slots / throughput, the token-weighted figure the tpot objective
   predicts) over the answer's, minus 1, averaged over its two pairs; blocks accumulate until
   the one-sided 95 % bound shows the contender behind, or at most 3 % ahead (the answer
   holds), or ahead by possibly more (the answer loses), or the time per rate (--minutes,
   default 30) runs out, reported with its bound. The bound's standard error comes from the
   spread of blocks pooled over the rate's contenders, with t-quantiles for the degrees of
   freedom that has (blocks taken minus contenders), and no contender is judged before three
   blocks of its own: a pair's two halves serve the same arrivals, yet their mean TPOT ratio
   moved by 10-25 % from one pair to the next here, and with two blocks a chance agreement of
   the two passed for a resolved comparison.

    .venv/bin/python benchmarks/openloop.py [--window 40] [--minutes 30] [--db URL] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import say_text, tuner, tuner_env
from record import Table, fmt, record_arguments, save_run

from tuner.bench import load_bench
from tuner.decide import settle
from tuner.decide.advice import recommend, standing
from tuner.decide.objective import ObjectiveKind
from tuner.decide.paired import Contrast, verdict
from tuner.measure.arrivals import OpenLoopFigures, poisson_offsets, summarize_open_loop
from tuner.measure.backend import ServerBackend
from tuner.measure.observe import Poller
from tuner.measure.profiler import Profiler, gather_context
from tuner.measure.schedule import PAIRS_PER_PASS
from tuner.measure.spec import load_spec
from tuner.model import queue
from tuner.policy import Policy
from tuner.settings import Settings
from tuner.storage.fits import current_fit
from tuner.storage.store import Store
from tuner.storage.traffic_profiles import TrafficSaver
from tuner.traffic import TrafficProfile

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "profiles" / "bench-smollm2-cpu.toml"
MODEL = "smollm2-135m-f32"
TARGETS = (1.5, 4.0, 7.0)
TOLERANCE = 0.03  # a contender at most this much better on mean TPOT leaves the answer standing
MIN_BLOCKS = 3  # a contender's blocks before any verdict


def mean_tpot_ms(f: OpenLoopFigures) -> float:
    return 1000.0 * f.mean_generating / f.tokens_per_second


class Judge:
    """One drafting launch, switched live, serving seeded arrivals for any N."""

    def __init__(self, profiler: Profiler, backend: ServerBackend, window_s: float) -> None:
        self.profiler, self.backend, self.window_s = profiler, backend, window_s
        self.workload = profiler.request_workload()
        self.began = time.monotonic()

    def serve(
        self, n: int, rate: float, draw: int, key: int, observe: bool = False
    ) -> tuple[OpenLoopFigures, TrafficProfile | None, object]:
        """N serves the draw's arrivals (request seeds from key); observed when asked."""
        policy = Policy.of_max_slots(n, self.profiler.spec.speculative.n_max)
        offsets = poisson_offsets(rate, self.window_s, draw)
        seen = view = watcher = None
        stop = threading.Event()
        if observe:
            poller = Poller(self.backend.serve(policy))
            view, seen = poller.view, TrafficProfile(poller.view.n_slots)

            def poll() -> None:
                while not stop.is_set():
                    poller.step(seen)

            watcher = threading.Thread(target=poll, daemon=True)
            watcher.start()
        measured = self.backend.arrivals(policy, offsets, key, None, self.workload)
        stop.set()
        if watcher is not None:
            watcher.join()
            poller.close()
        figures = summarize_open_loop(measured.samples, rate)
        print(
            f"  {time.monotonic() - self.began:6.0f} s  N={n}: {figures.tokens_per_second:.1f} "
            f"tok/s, mean TPOT {mean_tpot_ms(figures):.1f} ms, {figures.mean_generating:.2f} "
            f"generating, {figures.failed} failed",
            flush=True,
        )
        return figures, seen, view

    def compare(self, answer: int, contender: int, rate: float, block: int, seed: int) -> float:
        """One A B B A block: the contender's mean TPOT over the answer's, minus 1, averaged
        over the block's two pairs (each pair the same arrivals and request seeds)."""
        draw = seed * 1000 + block
        ratios = []
        for pair in range(2):
            key = block * PAIRS_PER_PASS + pair
            order = (answer, contender) if pair == 0 else (contender, answer)
            tpot = {n: mean_tpot_ms(self.serve(n, rate, draw, key)[0]) for n in order}
            ratios.append(tpot[contender] / tpot[answer] - 1.0)
        return sum(ratios) / 2


def advantages(blocks: dict[int, list[float]]) -> dict[int, Contrast]:
    """Each contender's advantage at a rate: the mean of its blocks, its standard error from the
    spread pooled over the rate's contenders (each contender's blocks about its own mean; the
    spread is the machine's and the arrivals', which every contender at the rate meets alike),
    with the degrees of freedom that pooling has: blocks taken minus contenders."""
    df = sum(len(bs) - 1 for bs in blocks.values() if bs)
    squares = sum((b - statistics.fmean(bs)) ** 2 for bs in blocks.values() if bs for b in bs)
    out = {}
    for m, bs in blocks.items():
        mean = statistics.fmean(bs) if bs else math.nan
        if df < 1 or not bs:
            out[m] = Contrast(mean, math.inf, 0.0)
        else:
            out[m] = Contrast(mean, math.sqrt(squares / df / len(bs)), float(df))
    return out


def judged(blocks: dict[int, list[float]], m: int) -> str:
    """A contender's verdict: unresolved before MIN_BLOCKS of its own blocks (with two, one
    chance agreement of two block values, each the mean of two pairs that differed by 25 %,
    passed for a resolved comparison), then the one-sided rule at the tolerance."""
    if len(blocks[m]) < MIN_BLOCKS:
        return settle.UNRESOLVED
    return verdict(advantages(blocks)[m], TOLERANCE)


VERDICT_COLUMNS = [
    "rate /s",
    "answer",
    "contender",
    "advantage %",
    "95 % lower %",
    "95 % upper %",
    "blocks",
    "verdict",
]


def verdict_rows(summary: list[tuple]) -> list[list]:
    """Per rate and contender: its advantage on mean TPOT (% faster than the answer) with its
    one-sided 95 % bounds, the blocks it took and the verdict."""
    rows: list[list] = []
    for rate, n, m, adv, v, count in summary:
        low, high = adv.bounds(0.95)
        rows.append([rate, f"N={n}", f"N={m}", 100 * adv.estimate, 100 * low, 100 * high, count, v])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=40.0, help="seconds of arrivals a round")
    parser.add_argument("--minutes", type=float, default=30.0, help="judge's time per rate")
    parser.add_argument("--db", help="a database holding the bench's profile (else profiled)")
    parser.add_argument("--seed", type=int, default=0)
    record_arguments(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-openloop-"))
    db = args.db or f"sqlite:///{work / 'tuner.db'}"
    env = tuner_env(db, work / "cache")
    if not args.db:
        started = time.monotonic()
        tuner(env, "profile", str(SPEC))
        tuner(env, "tune", "--model", MODEL)
        print(f"profile + tune: {time.monotonic() - started:.0f} s")
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
        "generating: " + ", ".join(f"{r:.3f}/s" for r in rates),
        flush=True,
    )
    judge_store = Store(f"sqlite:///{work / 'judge.db'}")
    backend = ServerBackend(spec, work / "logs", say_text, switch="live")
    profiler = Profiler(judge_store, spec, work / "logs", lambda e: None, backend=backend)
    profiler.create_run(gather_context(spec, None), kind="openloop")
    judge = Judge(profiler, backend, args.window)
    np_ = cm.n_parallel
    summary = []
    for k, rate in enumerate(rates):
        print(f"\nrate {rate:.3f}/s (target {TARGETS[k]} generating)", flush=True)
        _, seen, view = judge.serve(
            standing_n.max_slots, rate, 10_000 + k, 10_000 + k, observe=True
        )
        assert seen is not None
        name = f"openloop-{k}"
        TrafficSaver(store, name)(view, seen, True)
        answer = recommend(store, MODEL, host, traffic=name, objective=ObjectiveKind.TPOT)
        n = answer.policy.effective(np_)
        print(
            f"  observed {seen.mean_generating():.2f} generating, "
            f"{seen.arrival_rate or 0:.3f} requests/s finished: --objective tpot N={n}",
            flush=True,
        )
        # N-1, N+1 and always draft, each once (at N = np-1, N+1 is always draft)
        contenders = [m for m in settle.contenders(n, np_) if abs(m - n) == 1 or m == np_]
        blocks: dict[int, list[float]] = {m: [] for m in contenders}

        open_ = list(contenders)
        deadline = time.monotonic() + args.minutes * 60
        block = 0
        while open_ and time.monotonic() < deadline:
            for m in list(open_):
                # advantage of the contender: how much lower its mean TPOT is, relative
                blocks[m].append(-judge.compare(n, m, rate, block, args.seed + k))
                if judged(blocks, m) != settle.UNRESOLVED:
                    open_.remove(m)
            block += 1
        print(f"  N={n} against its contenders on mean TPOT (advantage > 0: contender faster):")
        pooled = advantages(blocks)
        for m in contenders:
            adv = pooled[m]
            low, high = adv.bounds(0.95)
            v = judged(blocks, m)
            print(
                f"    N={m}: {100 * adv.estimate:+.1f} % over {len(blocks[m])} blocks, "
                f"one-sided 95 % bounds [{100 * low:+.1f} %, {100 * high:+.1f} %] "
                f"(df {adv.df:.0f}, pooled over the rate's contenders): {v}"
            )
            summary.append((rate, n, m, adv, v, len(blocks[m])))
    backend.close()
    print("\n| rate /s | answer | contender | advantage | 95 % bounds | blocks | verdict |")
    print("|---|---|---|---|---|---|---|")
    rows = verdict_rows(summary)
    for rate, n, m, estimate, low, high, count, v in rows:
        print(
            f"| {rate:.3f} | {n} | {m} | {fmt(estimate, '+.1f')} % | "
            f"[{fmt(low, '+.1f')}, {fmt(high, '+.1f')}] % | {count} | {v} |"
        )
    ahead = [(m, r) for r, _, m, adv, _, _ in summary if adv.bounds(0.95)[0] > TOLERANCE]
    shown = ", ".join(f"N={m} at {r:.3f}/s" for m, r in ahead) or "none"
    wall = time.monotonic() - judge.began
    print(
        f"\ncontenders shown more than {100 * TOLERANCE:.0f} % ahead: "
        + shown
        + f"; wall time {wall:.0f} s; files in {work}"
    )
    save_run(
        __file__,
        args,
        {
            "standing N": standing_n.max_slots,
            f"contenders shown more than {100 * TOLERANCE:.0f} % ahead": shown,
            "wall s": wall,
        },
        [Table("the answer against its contenders on mean TPOT", VERDICT_COLUMNS, rows)],
    )


if __name__ == "__main__":
    main()
