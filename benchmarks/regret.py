"""Regret judge: is the tuner's answer on the bench at most 1 % behind any contender, judged on
data of the judge's own?

For each bench regime (profiles/bench-smollm2-cpu.toml: n-max 6 / synth-len 3.5,
bench-smollm2-cpu-nmax3.toml: n-max 3 / synth-len 2.0, bench-smollm2-cpu-late.toml: a
crossover above 4 streams), or a spec of the user's own (--spec), in one run on one machine:

1. the tuner as a user runs it, timed: `tuner profile SPEC`, then `tuner tune --plain-live`
   (the whole cost: profile and live steps, whether to draft at all settled side by side with
   the budget left), into a fresh database; its answer N, or plain;
2. the judge, independent of the tuner's data: fresh launches, another workload seed, a
   database of its own (none of the tuner's rows). For the answer against each contender (N-1,
   N+1, N-2, N+2, always draft) the weighted difference is measured only where they differ: the
   drafting server on and off in turn at each level between them (A B B A on one launch, the
   live switch), pairs accumulated sweep after sweep at the levels whose comparisons are still
   open, until each contender's one-sided 95 % bound shows the answer at most 1 % of the
   objective behind it (or behind not at all), or the contender more than 1 % ahead, or the
   judge's time per regime (--minutes, default 60) runs out. A contender surely ahead, but
   perhaps by less than 1 %, is measured on: "ahead" alone does not say which side of 1 % it
   is (the tie rule has the tuner choose the smaller of values within 1 %, so a contender a
   little ahead is expected). Plain against the answer the same way at every
   level, on two launches held up side by side (plain has no draft model to switch; each on its
   own port, the idle one waiting): plain's round and the answer's alternate A B B A at a level,
   seconds apart, where alternating launches put minutes and a model load between them.

The tuner's answer is N, or plain (no draft model) where its recommendation says drafting does
not pay (N then stands for a server that drafts anyway): plain shown more than 1 % ahead of a
drafting answer counts against it as a contender would, and N shown more than 1 % ahead of
plain counts against a plain answer.

It prints per regime: the tuner's answer and its cost, the judge's verdict per contender with
the advantage, its one-sided bounds and degrees of freedom, the pairs per level, and the
judge's own cost; then whether every contender was resolved and none was shown more than 1 %
ahead.

    .venv/bin/python benchmarks/regret.py [--regime NAME] [--spec SPEC.toml] [--minutes 60]
        [--keep DIR] [--plain-budget 240s]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from common import tuner, tuner_env
from record import Table, fmt, record_arguments, save_run

REPO = Path(__file__).resolve().parent.parent
REGIMES = ("bench-smollm2-cpu", "bench-smollm2-cpu-nmax3", "bench-smollm2-cpu-late")
JUDGE_SEED = 1000  # the judge's workload seed: not the tuner's (0)
BEYOND = "more than 1 % ahead"


def judged(advantage, tol: float) -> str:  # advantage: tuner.decide.paired.Contrast
    """The judge's question of a contender (its advantage over the answer): is it more than
    the tolerance ahead? One-sided 95 %: behind (upper bound at most 0), within the tolerance
    (upper bound at most tol), more than the tolerance ahead (lower bound above tol), else
    unresolved."""
    low, high = advantage.bounds(0.95)
    if high <= 0:
        return "behind"
    if high <= tol:
        return "within tolerance"
    if low > tol:
        return BEYOND
    return "unresolved"


def tuner_way(
    spec: Path, model: str, workdir: Path, plain_budget: str | None = None
) -> tuple[int, float, dict]:
    """profile + tune as a user runs them: (answer N, seconds, tune's report). The report's
    drafting_pays says whether the answer is N or plain (no draft model) with N kept for a
    server that drafts anyway. plain_budget: tune's --plain-budget, where not its default."""
    env = tuner_env(workdir / "tuner.db", workdir / "cache")
    started = time.perf_counter()
    tuner(env, "profile", str(spec))
    extra = ["--plain-budget", plain_budget] if plain_budget else []
    report = json.loads(
        tuner(env, "tune", "--model", model, "--plain-live", *extra, "--format", "json")
    )
    return int(report["standing"]), time.perf_counter() - started, report


def judge(spec_path: Path, answer: int, workdir: Path, minutes: float, plain_answer: bool) -> dict:
    """The judge's comparisons of the answer with its contenders and with plain."""
    from tuner.bench import load_bench
    from tuner.decide import settle
    from tuner.decide.paired import Contrast
    from tuner.decide.tune import live_gains, plain_gains, sweep_arms
    from tuner.measure.backend import ServerBackend
    from tuner.measure.profiler import Profiler, gather_context
    from tuner.measure.spec import load_spec
    from tuner.policy import Policy, drafts_at
    from tuner.settings import Settings
    from tuner.storage.store import Store

    bench = load_bench(Settings().bench_manifest_path)
    spec = load_spec(spec_path, [("workload.seed", JUDGE_SEED)], lambda: bench.as_refs())
    np_, n_max = spec.server.n_parallel, spec.speculative.n_max
    depth = spec.workload.context_tokens[0]
    weights = [1.0 / np_] * np_
    store = Store(f"sqlite:///{workdir / 'judge.db'}")
    context = gather_context(spec, None)

    def profiler(switch: str, side_by_side: bool = False) -> Profiler:
        backend = ServerBackend(
            spec, workdir / "logs", lambda e: None, switch=switch, side_by_side=side_by_side
        )
        p = Profiler(store, spec, workdir / "logs", lambda e: None, backend=backend)
        p.create_run(context, kind="sweep")
        return p

    started = time.perf_counter()
    deadline = started + minutes * 60
    live = profiler("live")
    # The first sweep covers every level (always draft alone at one stream): the objective's
    # scale, and every comparison's levels at once.
    arms = sweep_arms(range(2, np_ + 1), depth, n_max, live=True)
    arms[(depth, 1)] = [Policy.always(n_max)]
    live.run_pass(dict(sorted(arms.items())), pairs=2)
    sweeps = 1
    while True:
        rounds = live.repeats_by_cell()
        gains = live_gains({(0, cfg, c): reps for (cfg, _, c), reps in rounds.items()})
        on = _medians(rounds, lambda p, c: p.drafting and p.drafts_at(c))
        off = _medians(rounds, lambda p, c: p.drafting and not p.drafts_at(c))
        objective = sum(
            weights[c - 1] * (on[c] if c <= answer or c == 1 else off.get(c, on[c]))
            for c in range(1, np_ + 1)
        )
        tol = 0.01 * objective
        comparisons = {
            m: settle.advantage(gains, weights, answer, m) for m in settle.contenders(answer, np_)
        }
        verdicts = {m: judged(adv, tol) for m, adv in comparisons.items()}
        open_ = [m for m, v in verdicts.items() if v == "unresolved"]
        if not open_ or time.perf_counter() >= deadline:
            break
        levels = sorted({c for m in open_ for c in settle.between(answer, m)})
        live.run_pass(sweep_arms(levels, depth, n_max, live=True), pairs=2)
        sweeps += 1
    live.backend.close()
    contenders_s = time.perf_counter() - started
    # the live sweeps' drafting rounds: more request seeds for the mean acceptance the answer's
    # drafting halves are scaled to (tune.plain_gains; the same workload seed, so the same seeds)
    pool = [r for (cfg, _, c), reps in rounds.items() if drafts_at(cfg, c) for r in reps]

    # Plain against the answer: both launches up side by side, every level, A B B A at each
    # (plain's rounds and the answer's seconds apart, as the live switch pairs drafting ones).
    answer_policy = Policy.of_max_slots(answer, n_max)
    cross = profiler("relaunch", side_by_side=True)
    cells = [(depth, c) for c in range(1, np_ + 1)]
    plain_verdict, plain_adv, passes = "unresolved", Contrast(math.nan, math.inf, 0), 0
    plain_levels: dict = {}
    while time.perf_counter() < deadline or passes < 2:
        cross.run_pass({cell: [Policy.plain(), answer_policy] for cell in cells}, pairs=2)
        passes += 1
        if passes < 2:
            continue
        plain_levels = plain_gains(cross.repeats_by_cell(), answer_policy.config_name, pool)
        plain_adv = Contrast.of(plain_levels, {c: weights[c - 1] for c in range(1, np_ + 1)})
        # where the tuner answered plain, the drafting server is the contender
        plain_verdict = judged(
            Contrast(-plain_adv.estimate, plain_adv.se, plain_adv.df)
            if plain_answer
            else plain_adv,
            tol,
        )
        if plain_verdict != "unresolved":
            break
    cross.backend.close()
    store.dispose()
    return {
        "objective": objective,
        "tolerance": tol,
        "comparisons": {m: (comparisons[m], verdicts[m]) for m in comparisons},
        "plain": (plain_adv, plain_verdict, passes),
        "plain_levels": {c: (d.mean, d.sd, d.n) for c, d in sorted(plain_levels.items())},
        "pairs": {c: d.n for c, d in sorted(gains.items())},
        "sweeps": sweeps,
        "contenders_s": contenders_s,
        "seconds": time.perf_counter() - started,
    }


def _medians(rounds: dict, which) -> dict[int, float]:
    import statistics

    from tuner.policy import stored_policy

    values: dict[int, list[float]] = {}
    for (cfg, _, c), reps in rounds.items():
        policy = stored_policy(cfg)
        if policy is None or not which(policy, c):
            continue
        values.setdefault(c, []).extend(
            float(r["tokens_per_second"]) for r in reps if r.get("tokens_per_second")
        )
    return {c: statistics.median(v) for c, v in values.items() if v}


def plain_text(report: dict) -> str:
    """The tuner's plain figures as its report gives them: its plain advantage as the answer
    weighs it, and tune's side-by-side verdict; a bound that is still unbounded (tune's report
    has null there, as after a single side-by-side pass) reads inf, a missing figure n/a."""
    advantage = report.get("plain_advantage")  # [point, low, high] tok/s, or None
    plain = (
        f"{fmt(advantage[0], '+.2f')} [{fmt(advantage[1], '+.2f')}, "
        f"{fmt(advantage[2], '+.2f')}] tok/s"
        if advantage
        else "not judged"
    )
    live = report.get("plain_live")  # the side by side's verdict, resolved or not
    if live:
        low = fmt(-math.inf if live.get("low") is None else live["low"], "+.2f")
        high = fmt(math.inf if live.get("high") is None else live["high"], "+.2f")
        plain += (
            f"; side by side {fmt(live.get('estimate'), '+.2f')} [{low}, {high}] "
            f"against N={live['against']}, {live['verdict']} ({live['passes']} passes)"
        )
    return plain


def judge_rows(result: dict, answer: int, says_plain: bool) -> tuple[list[list], bool, list[str]]:
    """The judge's verdicts as rows (contender, levels, advantage, lower and upper one-sided
    95 % bounds, df, verdict), whether every one was resolved, and who was shown ahead."""
    rows: list[list] = []
    resolved, ahead = True, []
    for m, (adv, v) in result["comparisons"].items():
        low, high = adv.bounds(0.95)
        levels = ",".join(map(str, range(min(m, answer) + 1, max(m, answer) + 1)))
        rows.append([f"N={m}", levels, adv.estimate, low, high, adv.df, v])
        resolved &= v != "unresolved"
        if v == BEYOND:
            ahead.append(f"N={m}")
    adv, v, passes = result["plain"]
    low, high = adv.bounds(0.95)
    # the row is the contender's advantage: drafting's over plain where plain was the answer
    row = f"N={answer} (drafting) vs plain" if says_plain else "plain"
    estimate = -adv.estimate if says_plain else adv.estimate
    if says_plain:
        low, high = -high, -low
    rows.append(
        [row, "every level (side by side)", estimate, low, high, adv.df, f"{v} ({passes} passes)"]
    )
    resolved &= v != "unresolved"
    # Plain ahead of a drafting answer is a contender ahead; where the tuner's answer was
    # plain, N drafting shown ahead of plain is (judged on drafting - plain).
    if v == BEYOND:
        ahead.append(f"N={answer} (drafting)" if says_plain else "plain")
    return rows, resolved, ahead


JUDGE_COLUMNS = ["contender", "levels", "advantage", "lower 95 %", "upper 95 %", "df", "verdict"]
TUNER_COLUMNS = [
    "regime",
    "answer",
    "status",
    "tie",
    "plain as weighed",
    "seconds",
    "tune sweeps",
    "tune seconds",
]
SUMMARY_COLUMNS = [
    "regime",
    "answer",
    "tuner cost s",
    "every contender resolved",
    "shown > 1 % ahead",
    "judge min",
]


def tables(tuned: list[list], judged_rows: dict[str, list[list]], summary: list[list]) -> list:
    """The run's tables: the tuner's answers, the judge's verdicts per regime, the summary."""
    out = [Table("the tuner (profile + tune)", TUNER_COLUMNS, tuned)]
    for name, rows in judged_rows.items():
        out.append(
            Table(f"{name}: the judge (seed {JUDGE_SEED}, its own launches)", JUDGE_COLUMNS, rows)
        )
    out.append(Table("summary", SUMMARY_COLUMNS, summary))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", action="append", choices=REGIMES)
    parser.add_argument(
        "--spec",
        action="append",
        type=Path,
        help="a profile spec of your own (repeatable), judged as a regime is; with --spec only "
        "the regimes named by --regime run",
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="judge's time per regime")
    parser.add_argument("--keep", type=Path, help="keep databases and logs here")
    parser.add_argument(
        "--plain-budget",
        help="tune's --plain-budget (e.g. 240s) where not its default: what more plain passes "
        "buy, and cost",
    )
    record_arguments(parser)
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="tuner-regret-"))
    summary: list[list] = []
    tuned: list[list] = []
    judged_rows: dict[str, list[list]] = {}
    regimes = args.regime or ([] if args.spec else REGIMES)
    specs = [(name, REPO / "profiles" / f"{name}.toml") for name in regimes]
    for path in args.spec or ():
        if not path.is_file():
            parser.error(f"--spec {path}: no such file")
        specs.append((path.stem, path.resolve()))
    for name, spec in specs:
        import tomllib

        model = tomllib.loads(spec.read_text())["model_name"]
        work = base / name
        work.mkdir(parents=True, exist_ok=True)
        print(f"== {name}: the tuner (profile + tune) ==", flush=True)
        answer, cost, report = tuner_way(spec, model, work / "tuner", args.plain_budget)
        says_plain = report.get("drafting_pays") is False
        said = f"plain (N={answer} if drafting)" if says_plain else f"N={answer}"
        plain = plain_text(report)
        print(
            f"answer {said} ({report['status']}, tie {report['tie']}; plain against N={answer} "
            f"as the tuner's answer weighs it: {plain}) in {cost:.0f} s "
            f"(tune: {report['sweeps']} sweeps, {report['seconds']:.0f} s)",
            flush=True,
        )
        tuned.append(
            [
                name,
                said,
                report["status"],
                report["tie"],
                plain,
                cost,
                report["sweeps"],
                report["seconds"],
            ]
        )
        print(f"== {name}: the judge (seed {JUDGE_SEED}, its own launches) ==", flush=True)
        (work / "judge").mkdir(exist_ok=True)
        result = judge(spec, answer, work / "judge", args.minutes, says_plain)
        tol = result["tolerance"]
        print(
            f"objective of N={answer}: {result['objective']:.1f} tok/s weighted; tolerance "
            f"+-{tol:.2f} tok/s (1 %)"
        )
        rows, resolved, ahead = judge_rows(result, answer, says_plain)
        judged_rows[name] = rows
        print("| contender | levels | advantage | 95 % one-sided bounds | df | verdict |")
        print("|---|---|---|---|---|---|")
        for who, levels, estimate, low, high, df, v in rows:
            print(
                f"| {who} | {levels} | {fmt(estimate, '+.2f')} | "
                f"[{fmt(low, '+.2f')}, {fmt(high, '+.2f')}] | {fmt(df, '.1f')} | {v} |"
            )
        per_level = ", ".join(
            f"{c}: {fmt(mean, '+.1f')} (SD {fmt(sd, '.1f')}, {n} blocks)"
            for c, (mean, sd, n) in result["plain_levels"].items()
        )
        print(f"plain - N={answer} per level, tok/s: {per_level}")
        print(
            f"pairs per level {result['pairs']}; judge: {result['sweeps']} sweeps, "
            f"{result['contenders_s'] / 60:.1f} min on contenders, "
            f"{result['seconds'] / 60:.1f} min in all"
        )
        summary.append(
            [name, said, cost, resolved, ", ".join(ahead) or "none", result["seconds"] / 60]
        )
    print(
        "\n| regime | answer | tuner cost | every contender resolved | shown > 1 % ahead | judge |"
    )
    print("|---|---|---|---|---|---|")
    for name, answer, cost, resolved, ahead, judge_min in summary:
        print(
            f"| {name} | {answer} | {cost:.0f} s | {'yes' if resolved else 'no'} | "
            f"{ahead} | {judge_min:.1f} min |"
        )
    save_run(
        __file__,
        args,
        {
            "regimes": len(summary),
            "every contender resolved": all(row[3] for row in summary),
            "shown > 1 % ahead": "; ".join(f"{r[0]}: {r[4]}" for r in summary if r[4] != "none")
            or "none",
        },
        tables(tuned, judged_rows, summary),
    )


if __name__ == "__main__":
    main()
