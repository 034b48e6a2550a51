"""A soak of `tuner watch` against the bench: traffic that shifts half-way, the answers it writes,
and its memory over the run.

It profiles the bench spec into a fresh database (or uses --db), starts a bench llama-server
(-np 8, the F32 target), and runs `tuner watch` as a user would (its own process, deciding every
--every on the last --window) with an on-change command that counts reloads. A load generator
offers light traffic (rounds of 1 and 2 streams) for the first half and heavier traffic (rounds
of 4, 6 and 8 streams) for the second. At the end the watcher gets SIGTERM. Prints the answer
after every interval, how often the env file was written and the command ran, whether it
stopped cleanly, and its resident memory (VmRSS) after its first decision and at the end
(target: growth under 10 %).

    .venv/bin/python benchmarks/watch_soak.py [--minutes 20] [--every 120] [--db sqlite:///...]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import tuner, tuner_cmd, tuner_env
from lab.traffic import offer_cycle, plain_server

from tuner.bench import load_bench
from tuner.measure.launcher import ManagedServer
from tuner.settings import Settings

REPO = Path(__file__).resolve().parent.parent
LIGHT = [(1, 96), (2, 96)]
HEAVY = [(4, 64), (6, 64), (8, 64)]
MODEL = "smollm2-135m-f32"


def rss_kib(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) if found else None


def memory_figures(samples: list[tuple[float, int]], every: float) -> dict[str, float] | None:
    """The watcher's resident memory (MiB) after its first decision, at the end, at most, and
    the growth between the first two (%); None without a sample after the first decision."""
    after_first = [kib for t, kib in samples if t >= every + 30.0]
    if not after_first:
        return None
    base, end, top = after_first[0], after_first[-1], max(after_first)
    return {
        "VmRSS after the first decision MiB": base / 1024,
        "VmRSS at the end MiB": end / 1024,
        "VmRSS max MiB": top / 1024,
        "growth % (target: under 10)": 100 * (end / base - 1),
    }


def main() -> None:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=120.0, help="seconds between decisions")
    parser.add_argument("--db", help="a database with a profile of the bench spec already")
    record_arguments(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-soak-"))
    env = tuner_env(work / "tuner.db", work / "cache")
    if args.db:
        env["TUNER_DB"] = args.db
    else:
        started = time.monotonic()
        tuner(env, "profile", str(REPO / "profiles" / "bench-smollm2-cpu.toml"), "--budget", "0")
        print(f"profile: {time.monotonic() - started:.0f} s")
    print(tuner(env, "recommend", "--model", MODEL, "--explain").strip().splitlines()[0])

    bench = load_bench(Settings().bench_manifest_path)
    config = plain_server(bench, n_parallel=8)
    env_file = work / "server.env"
    env_file.write_text("# llama-server settings\nLLAMA_ARG_CTX_SIZE=4096\n")
    reloads = work / "reloads"
    log_path = work / "watch.log"
    total_s = 60.0 * args.minutes
    with ManagedServer(config, work / "server.log", start_timeout_s=120) as server:
        stop = threading.Event()

        def traffic() -> None:
            half = threading.Event()
            first = threading.Thread(target=offer_cycle, args=(server.url, LIGHT, half, []))
            first.start()
            stop.wait(total_s / 2)
            half.set()
            first.join()
            print(f"{time.strftime('%H:%M:%S')} traffic shifts to rounds of 4, 6 and 8 streams")
            offer_cycle(server.url, HEAVY, stop, [])

        load = threading.Thread(target=traffic, daemon=True)
        load.start()
        with log_path.open("w") as log:
            watcher = subprocess.Popen(
                tuner_cmd(
                    "watch",
                    "--model",
                    MODEL,
                    "--url",
                    server.url,
                    "--env-file",
                    str(env_file),
                    "--every",
                    f"{args.every:g}",
                    "--window",
                    f"{2 * args.every:g}",
                    "--on-change",
                    f"echo reload >> {reloads}",
                ),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            began = time.monotonic()
            samples: list[tuple[float, int]] = []
            while time.monotonic() - began < total_s and watcher.poll() is None:
                time.sleep(10.0)
                kib = rss_kib(watcher.pid)
                if kib is not None:
                    samples.append((time.monotonic() - began, kib))
            watcher.send_signal(signal.SIGTERM)
            try:
                code = watcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                watcher.kill()
                code = None
        stop.set()
        load.join(timeout=300)

    lines = log_path.read_text().splitlines()
    decisions = [line for line in lines if "slots generating on average" in line]
    print(f"\nwatch log ({len(lines)} lines), one line per interval:")
    for line in decisions:
        print("  " + line[:220])
    writes = sum(" wrote " in line for line in lines)
    ran = reloads.read_text().count("reload") if reloads.exists() else 0
    answers = re.findall(r": N=(\d+) \(was ", "\n".join(lines))
    print(f"\nanswers written in order: {', '.join(answers) or 'none'}")
    print(
        f"changes after the first answer: {max(0, len(answers) - 1)}; env-file writes {writes}; "
        f"on-change runs {ran}"
    )
    print(f"env file now: {env_file.read_text().strip().splitlines()}")
    print(f"SIGTERM: exit {code}; last line: {lines[-1] if lines else '-'}")
    memory = memory_figures(samples, args.every)
    if memory:
        base, end, top, growth = memory.values()
        print(
            f"VmRSS after the first decision {base:.1f} MiB, at the end {end:.1f} "
            f"MiB (max {top:.1f}): growth {growth:+.1f} % "
            "(target: under 10 %)"
        )
    print(f"files kept in {work}")
    summary = {
        "minutes": args.minutes,
        "every s": args.every,
        "answers written in order": [int(a) for a in answers],
        "changes after the first answer": max(0, len(answers) - 1),
        "env-file writes": writes,
        "on-change runs": ran,
        "exit on SIGTERM": code,
        **(memory or {}),
    }
    decided = [[line[:220]] for line in decisions]
    save_run(__file__, args, summary, [Table("one line per interval", ["watch"], decided)])


if __name__ == "__main__":
    main()
