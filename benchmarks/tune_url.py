"""Benchmark: `tuner tune --url` on a server the tuner did not start reaches the answer that
profile + tune reach on the same world launched by the tuner, and leaves the server as found.

For each world (the seed's gfx1151 world and two frozen worlds by default) and noise seed:

- running: `tuner dev twin serve WORLD --props --metrics --seed S --max-slots K` started by hand
  (a subprocess, as an operator would run llama-server), then `tuner check --url`, then
  `tuner tune --url`; the server's threshold read before and after;
- launched: a spec whose server is `tuner-twin-server` serving the same world with the same
  seed, then `tuner profile SPEC` and `tuner tune --model NAME`.

Both send the same workload (the running spec's defaults: 1, 2, 4, ... up to -np streams, uniform
weights). Per run: the two answers and their tie sets, whether they agree (the same N, or one's
tie holds the other's answer), the truth's best N under uniform weights and each answer's
regret, and whether the threshold afterwards equals the one before. Figures through record.py.

    .venv/bin/python benchmarks/tune_url.py [--seeds 5] [--worlds seed,frozen-00,frozen-01]
        [--speed 20] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import tuner_env
from record import Table, record_arguments, save_run
from tunerproc import run_tuner, twin_server_script

from tuner.measure.client import LlamaClient
from tuner.measure.launcher import free_port
from tuner.measure.spec import default_levels
from tuner.policy import Policy
from tuner.twin.truth import closed_truth
from tuner.twin.world import load_world

REPO = Path(__file__).resolve().parent.parent
TWIN = REPO / "profiles" / "twin"
WORLDS = {"seed": TWIN / "seed-gfx1151.toml"} | {
    path.stem: path for path in sorted((TWIN / "frozen").glob("frozen-*.toml"))
}
FOUND = 3  # the threshold the hand-started server runs with before the tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="noise seeds per world")
    parser.add_argument("--worlds", default="seed,frozen-00,frozen-01")
    parser.add_argument("--speed", type=float, default=20.0, help="the twin's virtual time")
    record_arguments(parser)
    args = parser.parse_args()
    rows = []
    for name in args.worlds.split(","):
        world_path = WORLDS[name]
        best = truth_best(world_path)
        for seed in range(1, args.seeds + 1):
            row = one(name, world_path, seed, args.speed, best)
            rows.append(row)
            print(line(row), flush=True)
    summary, tables = figures(rows)
    print(
        f"agree {summary['agree']} of {summary['runs']}; threshold left as found "
        f"{summary['restored']} of {summary['runs']}",
        flush=True,
    )
    save_run(__file__, args, summary, tables)


def truth_best(world_path: Path) -> dict[str, Any]:
    """The world's noise-free values per N and the best N, with the weights both methods use:
    the same at every level they measure (1, 2, 4, ... up to -np; default_levels)."""
    world = load_world(world_path)
    truth = closed_truth(world)
    weights = {c: 1.0 for c in default_levels(world.n_parallel)}
    choice = truth.best(weights)
    values = {
        n: truth.objective(Policy.of_max_slots(n, world.n_max), weights)
        for n in range(world.n_parallel + 1)
    }
    return {"best": choice.best.effective(world.n_parallel), "values": values}


def one(name: str, world_path: Path, seed: int, speed: float, best: dict[str, Any]) -> dict:
    """Both methods on one world and seed, each in a database of its own."""
    with tempfile.TemporaryDirectory(prefix="tune-url-") as tmp:
        folder = Path(tmp)
        running = running_method(folder, world_path, seed, speed)
        launched = launched_method(folder, world_path, seed, speed)
    values = best["values"]
    top = max(values.values())

    def regret(n: int | None) -> float | None:
        return None if n is None else 100 * (1 - values[min(n, max(values))] / top)

    agree = running["n"] is not None and (
        running["n"] == launched["n"]
        or running["n"] in launched["tie"]
        or launched["n"] in running["tie"]
    )
    return {
        "world": name,
        "seed": seed,
        "truth": best["best"],
        "running": running,
        "launched": launched,
        "agree": agree,
        "regret_running": regret(running["n"]),
        "regret_launched": regret(launched["n"]),
    }


def running_method(folder: Path, world: Path, seed: int, speed: float) -> dict[str, Any]:
    env = tuner_env(folder / "running.db", folder / "cache-running")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner",
            "dev",
            "twin",
            "serve",
            str(world),
            "--port",
            str(port),
            "--props",
            "--metrics",
            "--speed",
            f"{speed:g}",
            "--seed",
            str(seed),
            "--max-slots",
            str(FOUND),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_up(url)
        before = _threshold(url)
        checked = run_tuner(["check", "--url", url], env, 300)
        started = time.monotonic()
        tuned = run_tuner(["tune", "--url", url, "--format", "json"], env, 1800)
        wall = time.monotonic() - started
        after = _threshold(url)
    finally:
        server.terminate()
        server.wait(30)
    answer = _answer(tuned.stdout) if tuned.returncode == 0 else {}
    return {
        "check_rc": checked.returncode,
        "rc": tuned.returncode,
        "n": answer.get("standing"),
        "tie": answer.get("tie") or [],
        "status": answer.get("status"),
        "seconds": answer.get("seconds"),
        "wall_s": wall,
        "before": before,
        "after": after,
        "error": tuned.stderr.strip().splitlines()[-1] if tuned.returncode else "",
    }


def launched_method(folder: Path, world: Path, seed: int, speed: float) -> dict[str, Any]:
    env = tuner_env(folder / "launched.db", folder / "cache-launched")
    loaded = load_world(world)
    spec = folder / "spec.toml"
    spec.write_text(
        f'name = "launched-{loaded.name}"\nmodel_name = "{loaded.model_name}"\n\n[server]\n'
        f'binary = "{twin_server_script(folder)}"\nmodel = "{world}"\n'
        f"n_parallel = {loaded.n_parallel}\nctx_size = {loaded.slot_context * loaded.n_parallel}\n"
        f'args = ["--speed", "{speed:g}", "--seed", "{seed}"]\n\n[speculative]\n'
        f'args = ["--model-draft", "twin-draft", "--spec-type", "draft-simple"]\n'
        f"n_max = {loaded.n_max}\n\n[kernel]\nenabled = false\n"
    )
    started = time.monotonic()
    profiled = run_tuner(["profile", str(spec), "--budget", "5m"], env, 1800)
    tuned = (
        run_tuner(["tune", "--model", loaded.model_name, "--format", "json"], env, 1800)
        if profiled.returncode == 0
        else profiled
    )
    wall = time.monotonic() - started
    answer = json.loads(tuned.stdout) if tuned.returncode == 0 else {}
    return {
        "rc": tuned.returncode,
        "n": answer.get("standing"),
        "tie": answer.get("tie") or [],
        "status": answer.get("status"),
        "wall_s": wall,
        "error": tuned.stderr.strip().splitlines()[-1] if tuned.returncode else "",
    }


def _answer(stdout: str) -> dict[str, Any]:
    return json.loads(stdout).get("tune") or {}


def _wait_up(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with LlamaClient(url) as api:
                if api.health():
                    return
        except Exception:
            pass
        time.sleep(0.2)
    sys.exit(f"the twin server at {url} did not come up")


def _threshold(url: str) -> int | None:
    with LlamaClient(url) as api:
        return api.max_slots()


def line(row: dict[str, Any]) -> str:
    r, lch = row["running"], row["launched"]
    return (
        f"{row['world']} seed {row['seed']}: truth N={row['truth']}; tune --url N={r['n']} "
        f"tie {r['tie']} ({r['status']}, {r['wall_s']:.0f} s); profile+tune N={lch['n']} "
        f"tie {lch['tie']} ({lch['status']}, {lch['wall_s']:.0f} s); "
        f"{'agree' if row['agree'] else 'DIFFER'}; threshold {r['before']} -> {r['after']}"
        + (f"; error: {r['error']}" if r["error"] else "")
        + (f"; launched error: {lch['error']}" if lch["error"] else "")
    )


def figures(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Table]]:
    """The summary and the per-run table."""
    summary = {
        "runs": len(rows),
        "agree": sum(1 for r in rows if r["agree"]),
        "restored": sum(1 for r in rows if r["running"]["after"] == r["running"]["before"]),
        "check_ok": sum(1 for r in rows if r["running"]["check_rc"] == 0),
    }
    table = Table(
        "tune --url against profile + tune, per world and noise seed",
        [
            "world",
            "seed",
            "truth N",
            "tune --url N (tie)",
            "profile+tune N (tie)",
            "agree",
            "regret --url %",
            "regret launched %",
            "threshold before -> after",
        ],
        [
            [
                r["world"],
                r["seed"],
                r["truth"],
                f"{r['running']['n']} {r['running']['tie']}",
                f"{r['launched']['n']} {r['launched']['tie']}",
                "yes" if r["agree"] else "no",
                None if r["regret_running"] is None else round(r["regret_running"], 2),
                None if r["regret_launched"] is None else round(r["regret_launched"], 2),
                f"{r['running']['before']} -> {r['running']['after']}",
            ]
            for r in rows
        ],
    )
    return summary, [table]


if __name__ == "__main__":
    main()
