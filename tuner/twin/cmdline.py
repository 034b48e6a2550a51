"""The twin server's command line: llama-server's, read into `ServerArgs`, and the world and
policy a launch serves (`launch_world`).

A launch with a `--spec-type` other than none is the world's drafting server, without one the
plain one, as in llama.cpp 11434, whose `--spec-type` defaults to none: `--model-draft` alone
loads a draft model that never drafts (tools/server/server-context.cpp can_speculate; /slots
then says speculative false). The draft model's path is not read. `--spec-draft-max-slots`
(or LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS, checked with the patch's own message), `--spec-draft-n-max`,
`--parallel`, `--ctx-size` (per slot ctx/parallel, or all of it with `--kv-unified`), `-b`,
`--spec-synth-len`/`--spec-synth-rates` (over the world's acceptance), `--api-key`, `--alias`,
`--metrics`, `--props`, `--no-slots` mean what they mean to llama-server. Any other flag (the
tuner's `--threads`, a bench spec's `--poll 0`, `--no-repack`, ...) is accepted and has no
effect; it is listed in `ServerArgs.ignored` (and the server's log). Twin-only flags: `--speed
X` (virtual time runs X times faster than the wall), `--noise PRESET` (over the world's [noise]
preset), `--seed S` (the noise process and the seeds of requests that bring none; default:
random, as llama-server's sampling seed) and `--twin-unpatched` (a stock llama-server of the
same source, without the tuner's patch: `--spec-draft-max-slots` is an invalid argument and
LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS means nothing, so it always drafts; tuner.twin.server answers
/props as the stock build does).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tuner.errors import ConfigError
from tuner.inputs import validation_message
from tuner.policy import Policy
from tuner.twin.world import World, load_world

MAX_SLOTS_ENV = "LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS"
MAX_SLOTS_FLAG = "--spec-draft-max-slots"
UNPATCHED_FLAG = "--twin-unpatched"


class ArgError(ValueError):
    """A bad command line (llama-server prints it and exits with status 1)."""


# --- the command line --------------------------------------------------------------------------

# llama-server flags the twin reads: name -> (field, kind)
_VALUE_FLAGS: dict[str, tuple[str, str]] = {
    "-m": ("model", "path"),
    "--model": ("model", "path"),
    "--host": ("host", "str"),
    "--port": ("port", "port"),
    "-np": ("parallel", "pos"),
    "--parallel": ("parallel", "pos"),
    "-c": ("ctx_size", "nonneg"),
    "--ctx-size": ("ctx_size", "nonneg"),
    "-b": ("batch_size", "pos"),
    "--batch-size": ("batch_size", "pos"),
    "-md": ("model_draft", "str"),
    "--model-draft": ("model_draft", "str"),
    "--spec-type": ("spec_type", "str"),
    MAX_SLOTS_FLAG: ("max_slots", "max_slots"),
    "--spec-draft-n-max": ("n_max", "pos"),
    "--draft-max": ("n_max", "pos"),
    "--draft": ("n_max", "pos"),
    "--spec-synth-len": ("synth_len", "float"),
    "--spec-synth-rates": ("synth_rates", "rates"),
    "-s": ("seed", "int"),
    "--seed": ("seed", "int"),
    "--api-key": ("api_key", "str"),
    "-a": ("alias", "str"),
    "--alias": ("alias", "str"),
    "--speed": ("speed", "speed"),
    "--noise": ("noise", "noise"),
}
_BOOL_FLAGS: dict[str, tuple[str, bool]] = {
    "--metrics": ("metrics", True),
    "--props": ("props", True),
    "--slots": ("slots", True),
    "--no-slots": ("slots", False),
    "--twin-unpatched": ("unpatched", True),
    "-kvu": ("kv_unified", True),
    "--kv-unified": ("kv_unified", True),
    "-no-kvu": ("kv_unified", False),
    "--no-kv-unified": ("kv_unified", False),
}
# Flags without a value the twin accepts and ignores (so a value never follows them).
_IGNORED_SWITCHES = {
    "--no-repack",
    "--jinja",
    "--no-jinja",
    "--no-webui",
    "--cont-batching",
    "-cb",
    "--no-cont-batching",
    "--no-mmap",
    "--mlock",
    "-v",
    "--verbose",
    "--no-warmup",
    "--check-tensors",
    "--swa-full",
    "--no-perf",
    "--log-disable",
}
NOISE_PRESETS = ("off", "quiet", "vm")


@dataclass
class ServerArgs:
    """A twin launch, as llama-server's command line says it."""

    model: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int | None = None
    ctx_size: int | None = None
    batch_size: int | None = None
    kv_unified: bool = False
    model_draft: str | None = None
    spec_type: str | None = None
    max_slots: int = 0
    n_max: int | None = None
    synth_len: float | None = None
    synth_rates: list[float] | None = None
    seed: int | None = None
    api_key: str | None = None
    alias: str | None = None
    metrics: bool = False
    props: bool = False
    slots: bool = True
    speed: float = 1.0
    noise: str | None = None
    unpatched: bool = False  # a stock llama-server: no threshold flag, no live switch
    ignored: list[str] = field(default_factory=list)

    @property
    def drafting(self) -> bool:
        """A speculative type is on (with its draft model, or a draft-less type): the pinned
        build drafts only then, whatever --model-draft says."""
        return self.spec_type not in (None, "none")


def _max_slots(value: str, flag: str) -> int:
    # The patch's own check and message (common/arg.cpp).
    text = value.strip()
    if not text.isdigit():
        raise ArgError(
            f'error while handling argument "{flag}": --spec-draft-max-slots expects a '
            f"non-negative integer (0 = no limit), got '{value}'"
        )
    return int(text)


def _convert(flag: str, kind: str, value: str) -> Any:
    try:
        if kind in ("str",):
            return value
        if kind == "path":
            return Path(value)
        if kind == "max_slots":
            return _max_slots(value, flag)
        if kind == "rates":
            return [float(v) for v in value.split(",") if v.strip()]
        if kind == "noise":
            if value not in NOISE_PRESETS:
                raise ValueError(f"expected one of {', '.join(NOISE_PRESETS)}")
            return value
        if kind == "float":
            return float(value)
        if kind == "speed":
            speed = float(value)
            if not (math.isfinite(speed) and speed > 0):
                raise ValueError("expected a finite number above 0")
            return speed
        number = int(value)
        if kind == "pos" and number < 1:
            raise ValueError("expected an integer of 1 or more")
        if kind == "nonneg" and number < 0:
            raise ValueError("expected an integer of 0 or more")
        if kind == "port" and not 0 <= number <= 65535:
            raise ValueError("expected a port, 0 to 65535")
        return number
    except ArgError:
        raise
    except ValueError as exc:
        raise ArgError(f'error while handling argument "{flag}": {exc}') from exc


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ServerArgs:
    """llama-server's command line (and LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS) as ServerArgs; ArgError
    names the argument. Flags the twin does not read are accepted and listed in `ignored`."""
    env = os.environ if env is None else env
    args = ServerArgs()
    items = list(argv)
    unpatched = UNPATCHED_FLAG in items
    if env.get(MAX_SLOTS_ENV) is not None and not unpatched:  # the stock build never reads it
        args.max_slots = _max_slots(env[MAX_SLOTS_ENV], MAX_SLOTS_ENV)
    i = 0
    while i < len(items):
        token = items[i]
        flag, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        value: str | None = inline if "=" in token and token.startswith("--") else None
        if unpatched and flag == MAX_SLOTS_FLAG:
            raise ArgError(f"error: invalid argument: {flag}")  # the stock build's own words
        if flag in _VALUE_FLAGS:
            name, kind = _VALUE_FLAGS[flag]
            if value is None:
                if i + 1 >= len(items):
                    raise ArgError(f'error while handling argument "{flag}": expected value')
                value = items[i + 1]
                i += 1
            setattr(args, name, _convert(flag, kind, value))
        elif flag in _BOOL_FLAGS:
            name, on = _BOOL_FLAGS[flag]
            setattr(args, name, on)
        elif token.startswith("-"):
            args.ignored.append(token)
            nxt = items[i + 1] if i + 1 < len(items) else None
            takes_value = flag not in _IGNORED_SWITCHES and value is None
            if takes_value and nxt is not None and not _looks_like_flag(nxt):
                args.ignored.append(nxt)
                i += 1
        else:
            raise ArgError(f"error: invalid argument: {token}")
        i += 1
    if args.model is None:
        raise ArgError("error: --model WORLD.toml is required (the twin's world file)")
    return args


def _looks_like_flag(text: str) -> bool:
    if not text.startswith("-"):
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def launch_world(args: ServerArgs) -> tuple[World, Policy]:
    """The world a launch serves (its shape set by the command line) and its policy; a bad
    world file or combination is one ConfigError line."""
    assert args.model is not None
    world = load_world(args.model)
    changes: dict[str, Any] = {}
    n_parallel = args.parallel or world.n_parallel
    if args.parallel:
        changes["n_parallel"] = args.parallel
    if args.ctx_size:
        changes["slot_context"] = args.ctx_size if args.kv_unified else args.ctx_size // n_parallel
    if args.batch_size:
        changes["n_batch"] = args.batch_size
    if args.synth_len is not None or args.synth_rates is not None:
        changes["n_max"] = args.n_max or world.n_max
        # the synthetic acceptance replaced, what moves it (factors, classes) kept
        base = world.acceptance.model_dump(exclude={"synth_len", "rates"})
        changes["acceptance"] = base | (
            {"synth_len": args.synth_len}
            if args.synth_len is not None
            else {"rates": args.synth_rates}
        )
    if args.noise is not None:
        changes["noise"] = {"preset": args.noise}
    if changes:
        try:
            world = world.with_updates(**changes)
        except ValidationError as exc:
            raise ConfigError(validation_message(f"{args.model} as launched", exc)) from exc
    n_max = args.n_max or world.n_max
    if n_max > 64:
        raise ConfigError(f"--spec-draft-n-max {n_max}: the twin drafts at most 64 tokens")
    policy = Policy.of_max_slots(args.max_slots, n_max) if args.drafting else Policy.plain()
    return world, policy
