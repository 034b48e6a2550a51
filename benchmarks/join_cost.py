"""What a prompt joining the decode batch costs the slots already generating, on the bench, beside
the price a twin world puts on it.

In open loop a new request's prompt is evaluated in the same step as the running slots' decode
rows (llama-server batches them), so every generating slot waits for it. The twin charges that
step `prefill.ms_per_token` (plus `draft_ms_per_token` on a drafting server) per prompt token,
calibrated from the slope of the closed levels' time to first token; whether the running slots
pay that much is what this measures.

One stream generates --tokens tokens alone (A) or while --joins short requests (a --prompt-token
prompt of its own text, one output token) arrive at fixed shares of its generation (B). A and B
alternate A B B A on one launch with the same request seed, so the stream's own draws
(synthetic acceptance) are the same in both; the cost of a join is (T_B - T_A) / joins, T the
stream's first-to-last-token time, paired per block, with its t-interval. Run for a plain
server and a drafting one (no threshold).

    .venv/bin/python benchmarks/join_cost.py [--blocks 6] [--world WORLD.toml]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: F401  (puts tests/ on sys.path: lab)
from lab.traffic import plain_server
from scipy import stats

from tuner.bench import load_bench
from tuner.measure.client import LlamaClient
from tuner.measure.launcher import LaunchConfig, ManagedServer
from tuner.settings import Settings
from tuner.twin.world import load_world

WORDS = [
    "river",
    "stone",
    "cloud",
    "lamp",
    "orchard",
    "violet",
    "harbor",
    "copper",
    "meadow",
    "lantern",
]


def drafting(plain: LaunchConfig, draft: Path) -> LaunchConfig:
    """The plain launch with the bench's draft model (as its profile spec has it)."""
    args = ["--model-draft", str(draft), "--spec-type", "draft-simple"]
    args += ["--spec-synth-len", "3.5", "--spec-draft-n-max", "6"]
    return dataclasses.replace(plain, args=[*plain.args, *args])


def prompt_of(client: LlamaClient, tokens: int, salt: int) -> str:
    """Text of exactly `tokens` tokens, different for every salt (no prompt cache reuse)."""
    words = [WORDS[(salt * 7 + i * 3) % len(WORDS)] + str(salt) for i in range(tokens)]
    ids = client.tokenize(" ".join(words))[:tokens]
    return client.detokenize(ids)


def stream_time(
    url: str,
    prompt: str,
    tokens: int,
    joins: list[str] | None = None,
    shares: list[float] | None = None,
    est: float = 0.0,
) -> float:
    """The stream's first-to-last-token seconds; each join request sent through its own
    connection, shares[i] x est seconds after the stream's first token. A fresh connection for
    every request: llama-server closes a streamed response's connection."""
    joins, shares = joins or [], shares or []
    times: list[float] = []
    senders: list[threading.Thread] = []

    def send(text: str, delay: float) -> None:
        time.sleep(delay)
        with LlamaClient(url) as own:
            own.complete({"prompt": text, "n_predict": 1, "cache_prompt": False, "seed": 7})

    def on_chunk(chunk: dict) -> None:
        if not chunk.get("content"):
            return
        if not times:
            for text, share in zip(joins, shares, strict=True):
                sender = threading.Thread(target=send, args=(text, share * est), daemon=True)
                sender.start()
                senders.append(sender)
        times.append(time.perf_counter())

    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "ignore_eos": True,
        "cache_prompt": False,
        "seed": 1234,
    }
    with LlamaClient(url) as client:
        client.stream(body, on_chunk=on_chunk)
    for sender in senders:
        sender.join()
    return times[-1] - times[0]


def measure(config: LaunchConfig, name: str, args: argparse.Namespace) -> tuple[float, ...]:
    """The paired cost of a join in ms (mean, 95 % interval) and the stream's time alone."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        ManagedServer(config, Path(tmp) / "server.log", start_timeout_s=180, name=name) as srv,
        LlamaClient(srv.url) as client,
    ):
        prompt = prompt_of(client, args.prompt_tokens, 0)
        stream_time(srv.url, prompt, args.tokens)  # warm-up
        est = statistics.median(stream_time(srv.url, prompt, args.tokens) for _ in range(3))
        shares = [(i + 1) / (args.joins + 1) for i in range(args.joins)]
        diffs: list[float] = []
        salt = 1
        for block in range(args.blocks):
            t: dict[str, float] = {}
            for arm in "AB" if block % 2 == 0 else "BA":
                if arm == "A":
                    t[arm] = stream_time(srv.url, prompt, args.tokens)
                    continue
                joins = [prompt_of(client, args.prompt_tokens, salt + i) for i in range(args.joins)]
                salt += args.joins
                t[arm] = stream_time(srv.url, prompt, args.tokens, joins, shares, est)
            diffs.append((t["B"] - t["A"]) / args.joins * 1000.0)
            print(
                f"  {name} block {block + 1}: alone {t['A']:.3f} s, with {args.joins} joins "
                f"{t['B']:.3f} s: {diffs[-1]:+.1f} ms a join",
                flush=True,
            )
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    q = float(stats.t.ppf(0.975, len(diffs) - 1))
    return mean, mean - q * se, mean + q * se, est


JOIN_COLUMNS = ["server", "ms a join", "95 % lower", "95 % upper", "stream alone s", "twin ms"]


def join_rows(
    results: dict[str, tuple[float, ...]], price: tuple[float, float] | None
) -> list[list]:
    """Per server: a join's mean cost (ms) with its 95 % t-interval, the stream's time alone,
    and the twin world's price where one was given."""
    return [
        [name, mean, low, high, alone, price[i] if price else None]
        for i, (name, (mean, low, high, alone)) in enumerate(results.items())
    ]


def main() -> None:
    from record import Table, record_arguments, save_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6, help="A B blocks per server (>= 2)")
    parser.add_argument("--tokens", type=int, default=128, help="the stream's output tokens")
    parser.add_argument("--joins", type=int, default=3, help="join requests during a B stream")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="a join's prompt tokens")
    parser.add_argument("--world", type=Path, help="a twin world whose price to print beside")
    record_arguments(parser)
    args = parser.parse_args()
    if args.blocks < 2:
        parser.error("--blocks must be at least 2 (an interval needs two)")
    bench = load_bench(Settings().bench_manifest_path)
    plain = plain_server(bench, n_parallel=4)
    results = {
        "plain": measure(plain, "plain", args),
        "drafting": measure(drafting(plain, bench.draft), "drafting", args),
    }
    price = None
    if args.world is not None:
        world = load_world(args.world)
        price = (
            args.prompt_tokens * world.prefill.ms_per_token,
            args.prompt_tokens * (world.prefill.ms_per_token + world.prefill.draft_ms_per_token),
        )
    print(
        f"\na join of {args.prompt_tokens} prompt tokens into one stream of {args.tokens} tokens "
        f"({args.blocks} A B blocks, {args.joins} joins a B stream; ms a join, 95 % t-interval)"
    )
    rows = join_rows(results, price)
    for name, mean, low, high, alone, twin_ms in rows:
        twin = f"; twin {args.world.name}: {twin_ms:.1f} ms" if price else ""
        print(
            f"{name:9s} {mean:+7.1f} [{low:+.1f}, {high:+.1f}] (stream alone {alone:.2f} s){twin}"
        )
    title = (
        f"a join of {args.prompt_tokens} prompt tokens into one stream of {args.tokens} tokens "
        f"({args.blocks} A B blocks, {args.joins} joins a B stream)"
    )
    summary = {"twin world": args.world.name if args.world else None}
    save_run(__file__, args, summary, [Table(title, JOIN_COLUMNS, rows)])


if __name__ == "__main__":
    main()
