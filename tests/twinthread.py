"""A twin llama-server in a thread of the test's own process, for tests that need a server to
talk to over HTTP and nothing of its timing: the bench world, noise off, drafting, /metrics and
the live switch on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.twin.cmdline import launch_world, parse_args
from tuner.twin.server import TwinServer

REPO = Path(__file__).resolve().parent.parent
BENCH_WORLD = REPO / "profiles" / "twin" / "bench-smollm2-cpu.toml"
DRAFTING = ["--model-draft", "twin-draft", "--spec-type", "draft-simple", "--spec-draft-n-max", "6"]


def twin_in_thread(
    *extra: str, port: int = 0, speed: float = 50.0, world: Path = BENCH_WORLD, parallel: int = 4
) -> TwinServer:
    """A drafting twin of the bench world (4 slots, --metrics --props, noise off) serving from a
    thread, on `port` (0: any free one), with `extra` flags; stop it with stop_thread(). `world`
    and `parallel` serve another world."""
    argv = [
        "--model", str(world), "--port", str(port), "--parallel", str(parallel),
        "--ctx-size", "4096", "--kv-unified", "--noise", "off", "--speed", f"{speed:g}",
        "--metrics", "--props", "--poll", "0", *DRAFTING, *extra,
    ]  # fmt: skip
    args = parse_args(argv, env={})
    world, policy = launch_world(args)
    return TwinServer(args, world, policy, log=lambda _: None).start_in_thread()


def four_rounds(max_tokens: int) -> list[tuple[str, Any]]:
    """attach's overrides for four rounds at 2 streams of max_tokens each, no warm-up."""
    return [
        ("workload.concurrency", [2]),
        ("workload.max_tokens", max_tokens),
        ("workload.warmup", 0),
        ("workload.min_repeats", 4),
        ("workload.max_repeats", 4),
    ]
