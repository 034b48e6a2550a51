"""`tuner-twin-server`, the twin's command: llama-server's probes answered from text alone, any
other command line served by tuner.twin.server.

A tuner's preflight and build probe run `--help`, `--version` and `--list-devices` before every
launch; answered here, before numpy and the engine are imported, each costs a Python start-up
(about 0.1 s of CPU) instead of a third of a second.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tuner.twin.version import VERSION_TEXT

if TYPE_CHECKING:
    from tuner.twin.cmdline import ServerArgs

BIND_FAILURE = "couldn't bind HTTP server socket"  # what llama-server logs (ManagedServer reads it)

HELP_TEXT = """usage: tuner-twin-server [options]

The tuner's twin of llama-server: a simulated server whose world file stands in for the model.

----- common params -----

-m,    --model FNAME                    the twin's world file (TOML; see tuner.twin.world)
-np,   --parallel N                     number of server slots (default: the world's n_parallel)
-c,    --ctx-size N                     size of the context (per slot ctx/parallel; all of it
                                        with --kv-unified; default: the world's slot_context)
-b,    --batch-size N                   rows of one step (default: the world's n_batch)
-kvu,  --kv-unified                     one KV buffer shared by all slots
-s,    --seed SEED                      seed of the step-time noise and of requests that bring
                                        none (default: random)
-t,    --threads N                      accepted, no effect

----- speculative params -----

-md,   --model-draft FNAME              load a draft model (the file is not read); it drafts
                                        only with a --spec-type, as in build 11434
--spec-type TYPE                        speculative type (default none); any but none
                                        drafts: the world's drafting server
--spec-draft-n-max N                    number of tokens to draft (default: the world's n_max)
--spec-draft-max-slots N                start no new drafts while more than N slots are
                                        generating, 0 = no limit (default: 0)
                                        (env: LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS)
--spec-synth-len L                      synthetic mean acceptance length (over the world's)
--spec-synth-rates P0,P1,...            synthetic acceptance per position (over the world's)

----- server params -----

--host HOST                             ip address to listen on (default: 127.0.0.1)
--port PORT                             port to listen on (default: 8080)
--api-key KEY                           API key the clients must send
-a,    --alias NAME                     model name in responses (default: the world's
                                        model_name)
--metrics                               enable prometheus compatible metrics endpoint
--props                                 enable changing global properties via POST /props
--slots, --no-slots                     expose slots monitoring endpoint (default: enabled)

----- twin params -----

--speed X                               virtual time runs X times faster than the wall
                                        (default: 1)
--noise PRESET                          off, quiet or vm, over the world's [noise] preset
--twin-unpatched                        serve as a stock llama-server without the tuner's
                                        patch: no threshold flag nor field in GET /props,
                                        and POST /props changes nothing
"""
# What --help lists only with the patch (a stock build's help has no such lines).
PATCH_HELP = (
    "--spec-draft-max-slots N                start no new drafts while more than N slots are\n"
    "                                        generating, 0 = no limit (default: 0)\n"
    "                                        (env: LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS)\n"
)


def main(argv: Sequence[str] | None = None) -> int:
    """`tuner-twin-server`: llama-server's command line, a twin behind it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        unpatched = "--twin-unpatched" in argv
        print(HELP_TEXT.replace(PATCH_HELP, "") if unpatched else HELP_TEXT)
        return 0
    if "--version" in argv:
        print(VERSION_TEXT, file=sys.stderr)
        return 0
    if "--list-devices" in argv:
        print("Available devices:")
        return 0
    return run(argv)


def serve(args: ServerArgs, log: Callable[[str], None] | None = None) -> None:
    """Run a twin server until SIGTERM or SIGINT (blocking); ConfigError for a bad world."""
    import asyncio
    import signal

    from tuner.twin.cmdline import launch_world
    from tuner.twin.server import TwinServer

    world, policy = launch_world(args)
    server = TwinServer(args, world, policy, log)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.serve(stop)

    asyncio.run(main())


def run(argv: Sequence[str]) -> int:
    """Serve llama-server's command line argv (tuner.twin.command answers the probes); the exit
    status llama-server would give."""
    from tuner.errors import ConfigError
    from tuner.twin.cmdline import ArgError, parse_args

    try:
        args = parse_args(argv)
        serve(args)
    except ArgError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the port is taken (or the host is not ours)
        print(f"{BIND_FAILURE}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
