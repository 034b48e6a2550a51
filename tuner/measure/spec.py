"""Profile specs: TOML files in profiles/, validated by pydantic (unknown keys are errors).

A spec names the server to launch, the speculative set-up, the workload and the model name that
results are stored under. String values of the form `bench:NAME` (`bench:llama-server`,
`bench:target`, `bench:draft`, ...) are resolved through the bench manifest, so the shipped specs
work on any machine after `tuner bench setup`.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import ConfigError
from tuner.inputs import read_toml, validation_message
from tuner.measure.fingerprint import TWIN_SUFFIX, require_gguf, twin_model_name
from tuner.measure.prompts import OutputLengths, load_prompts

BENCH_PREFIX = "bench:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSpec(_Strict):
    """How to launch llama-server."""

    binary: Path = Field(description="llama-server executable")
    model: Path = Field(description="target model GGUF")
    n_parallel: int = Field(8, ge=1, le=256, description="-np: server slots")
    ctx_size: int = Field(4096, ge=256, description="-c: total context (all slots)")
    threads: int | None = Field(None, ge=1, description="-t; default: llama-server's choice")
    args: list[str] = Field(default_factory=list, description="extra arguments for every launch")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")
    start_timeout_s: float = Field(180.0, gt=0)
    port: int | None = Field(
        None, ge=1, le=65535, description="fixed loopback port; default: a free one per launch"
    )
    # A running server the tuner did not start (`tune --url`): recorded so that what the tuner
    # suggests about these data (measure more, continue) names the servers they came from.
    url: str | None = Field(None, description="the running server measured (tune --url)")
    plain_url: str | None = Field(None, description="the plain server beside it (--plain-url)")


class SpeculativeSpec(_Strict):
    """The drafting set-up used by the spec and threshold configurations."""

    args: list[str] = Field(description="llama-server drafting arguments (draft model, MTP, ...)")
    n_max: int = Field(3, ge=1, le=64, description="--spec-draft-n-max")
    threshold: int | None = Field(
        None, ge=1, description="also measure --spec-draft-max-slots N (needs the patched server)"
    )

    @model_validator(mode="after")
    def _drafts(self) -> SpeculativeSpec:
        # llama.cpp 11434's --spec-type defaults to none: a draft model alone never drafts
        # (the server then measures as plain while every drafting policy is asked for)
        typed = any(a == "--spec-type" or a.startswith("--spec-type=") for a in self.args)
        if self.draft_model() is not None and not typed:
            raise ValueError(
                "args: --model-draft without --spec-type: llama-server (build 11434) loads the "
                "draft model and never drafts; add --spec-type draft-simple"
            )
        return self

    def draft_model(self) -> Path | None:
        """The draft model file the arguments load (`-md`/`--model-draft`), if any."""
        for i, arg in enumerate(self.args):
            if arg.startswith("--model-draft="):
                return Path(arg.split("=", 1)[1])
            if arg in ("-md", "--model-draft") and i + 1 < len(self.args):
                return Path(self.args[i + 1])
        return None


class OutputSpec(_Strict):
    """How many tokens each request generates (every request of a level still starts together;
    with lengths that differ the level's window ends when its shortest stream does)."""

    distribution: Literal["fixed", "uniform", "lognormal", "file"] = Field(
        "fixed",
        description="fixed: workload.max_tokens; uniform: min..max; lognormal: median and "
        "sigma, clipped to min..max; file: each prompt's max_tokens (workload.max_tokens where "
        "a line has none)",
    )
    min: int = Field(8, ge=1, description="shortest output (uniform, lognormal)")
    max: int | None = Field(None, ge=1, description="longest output (uniform, lognormal)")
    median: int | None = Field(None, ge=1, description="lognormal: median output length")
    sigma: float = Field(0.5, gt=0, description="lognormal: sigma of log(length)")

    @model_validator(mode="after")
    def _complete(self) -> OutputSpec:
        if self.distribution == "uniform" and self.max is None:
            raise ValueError("distribution uniform needs max (and min, default 8)")
        if self.distribution == "lognormal" and self.median is None:
            raise ValueError("distribution lognormal needs median")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self

    def lengths(self, max_tokens: int) -> OutputLengths:
        return OutputLengths(
            self.distribution, max_tokens, self.min, self.max, self.median, self.sigma
        )


class WorkloadSpec(_Strict):
    """What the load generator sends, and how often."""

    prompt_tokens: int = Field(
        32, ge=1, description="length of the synthetic prompt (when no prompts file is given)"
    )
    max_tokens: int = Field(128, ge=8, description="tokens generated per request")
    prompts: Path | None = Field(
        None,
        description='the user\'s prompts: JSONL of {"prompt"} or {"messages"} (chat), or '
        "one prompt per line; relative to the spec file",
    )
    prompts_sha256: str | None = Field(
        None, description="filled in by tuner: the prompt file's content hash"
    )
    seed: int = Field(0, description="seed of the prompt and output-length draws")
    output: OutputSpec = OutputSpec()
    context_tokens: list[int] = Field(
        default_factory=lambda: [0],
        description="context depths: tokens each stream already holds when it starts decoding "
        "(its prompt, padded to reach the depth); every level is measured at each",
    )
    depth_weights: dict[int, float] | None = Field(
        None,
        description="share of time your slots spend at each context depth, e.g. {0 = 0.3, "
        "4096 = 0.7}: `recommend` answers for this mix unless --context is given",
    )
    depth_output: Literal["equal-time", "full"] = Field(
        "equal-time",
        description="at depths beyond the shallowest: equal-time shortens each request's output "
        "by how much slower a step is there (as measured so far in the run), so a deep level "
        "takes about as long as a shallow one; full keeps every length",
    )
    depth_min_tokens: int = Field(
        32, ge=8, description="equal-time: the fewest output tokens a deep request gets"
    )
    concurrency: list[int] | None = Field(
        None, description="levels; default 1, 2, 4, ... up to and including n_parallel"
    )
    min_repeats: int = Field(2, ge=1)
    max_repeats: int = Field(3, ge=1)
    target_spread: float = Field(
        0.02, gt=0, description="stop repeating once the step time's MAD/median is this small"
    )
    target_tps_spread: float = Field(
        0.05, gt=0, description="... and the aggregate tok/s's MAD/median is this small"
    )
    warmup: int = Field(1, ge=0, description="warm-up rounds after each server start")
    interleave: bool = Field(
        True,
        description="measure the configurations in alternating passes, one launch and one "
        "repeat per level each (A B, B A, ...), so a drift of the machine hits all alike",
    )
    stream: bool = True
    request_timeout_s: float = Field(60.0, gt=0, description="longest silence from the server")
    weights: dict[int, float] | None = Field(
        None, description="share of time the server spends at each concurrency (default uniform)"
    )

    @field_validator("concurrency")
    @classmethod
    def _levels_positive(cls, levels: list[int] | None) -> list[int] | None:
        if levels is None:
            return None
        if not levels:
            raise ValueError("needs at least one level")
        if any(c < 1 for c in levels):
            raise ValueError("every concurrency level must be at least 1")
        return sorted(set(levels))

    @field_validator("context_tokens")
    @classmethod
    def _depths_valid(cls, depths: list[int]) -> list[int]:
        if not depths:
            raise ValueError("needs at least one depth (0: the prompt alone)")
        if any(d < 0 for d in depths):
            raise ValueError("context depths are token counts, 0 or more")
        return sorted(set(depths))

    @property
    def longest_output(self) -> int:
        o = self.output
        if o.distribution in ("uniform", "lognormal"):
            return o.max or 4 * (o.median or self.max_tokens)
        return self.max_tokens

    @field_validator("depth_weights")
    @classmethod
    def _depth_weights_valid(cls, weights: dict[int, float] | None) -> dict[int, float] | None:
        if weights is None:
            return None
        if any(d < 0 for d in weights):
            raise ValueError("depths are token counts, 0 or more")
        if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
            raise ValueError("shares must be non-negative with at least one above zero")
        return dict(sorted(weights.items()))

    @field_validator("weights")
    @classmethod
    def _weights_valid(cls, weights: dict[int, float] | None) -> dict[int, float] | None:
        if weights is None:
            return None
        if any(c < 1 for c in weights):
            raise ValueError("weight keys are concurrency levels, at least 1")
        if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
            raise ValueError("weights must be non-negative with at least one above zero")
        return dict(sorted(weights.items()))

    @model_validator(mode="after")
    def _repeat_bounds(self) -> WorkloadSpec:
        if self.max_repeats < self.min_repeats:
            raise ValueError("max_repeats must be at least min_repeats")
        if self.output.distribution == "file" and self.prompts is None:
            raise ValueError('output.distribution = "file" needs a prompts file')
        return self


class KernelSpec(_Strict):
    """Kernel-level measurements with llama-batched-bench (skipped when it is not there)."""

    enabled: bool = True
    binary: Path | None = Field(
        None, description="llama-batched-bench; default: beside llama-server"
    )
    generation_tokens: int = Field(16, ge=2, description="-ntg: decode steps per point")
    prompt_repeats: int = Field(
        5, ge=0, description="full-draft prompt batches measured again alone, this many times"
    )
    args: list[str] = Field(default_factory=list, description="extra llama-batched-bench arguments")


class ProbesSpec(_Strict):
    """The arrival probes after the base levels (tuner.measure.probes): what a request costs
    beyond its decode steps, which the open-loop answers need."""

    enabled: bool = Field(
        True, description="off: open-loop answers fall back to closed levels, said so"
    )
    repeats: int = Field(
        2, ge=1, le=10, description="rounds of each probe shape (fewer: a quicker, rougher fit)"
    )


class ProfileSpec(_Strict):
    """A whole profile spec."""

    name: str = Field(min_length=1, description="spec name (runs are resumed by spec)")
    model_name: str = Field(min_length=1, description="results are stored under this model name")
    server: ServerSpec
    speculative: SpeculativeSpec
    workload: WorkloadSpec = WorkloadSpec()
    kernel: KernelSpec = KernelSpec()
    probes: ProbesSpec = ProbesSpec()

    @model_validator(mode="after")
    def _levels_fit_slots(self) -> ProfileSpec:
        levels = self.workload.concurrency
        if levels and max(levels) > self.server.n_parallel:
            raise ValueError(
                f"workload.concurrency: level {max(levels)} exceeds server.n_parallel "
                f"({self.server.n_parallel}); all streams must generate together"
            )
        if self.speculative.threshold and self.speculative.threshold > self.server.n_parallel:
            raise ValueError(
                f"speculative.threshold: {self.speculative.threshold} exceeds server.n_parallel "
                f"({self.server.n_parallel})"
            )
        self._depths_fit_context()
        return self

    def _depths_fit_context(self) -> None:
        """The deepest stream, its output included, must fit its share of the KV cache: a slot's
        ctx_size / n_parallel, or with --kv-unified the whole cache shared by the largest level.
        (A user prompt longer than the depth is checked when it is drawn.)"""
        w = self.workload
        deepest = max(max(w.context_tokens), w.prompt_tokens) + w.longest_output
        unified = "--kv-unified" in self.server.args or "-kvu" in self.server.args
        streams = max(self.levels) if unified else self.server.n_parallel
        room = self.server.ctx_size // streams
        if deepest > room:
            share = (
                f"{self.server.ctx_size} shared by {streams} streams (--kv-unified)"
                if unified
                else f"{self.server.ctx_size} over {streams} slots"
            )
            raise ValueError(
                f"workload.context_tokens: depth {max(w.context_tokens)} plus up to "
                f"{w.longest_output} output tokens needs {deepest} tokens per stream; "
                f"server.ctx_size {share} gives {room}: raise server.ctx_size to at least "
                f"{deepest * streams} or ask for less depth"
            )

    @property
    def levels(self) -> list[int]:
        if self.workload.concurrency:
            return list(self.workload.concurrency)
        return default_levels(self.server.n_parallel)

    def weights(self) -> dict[int, float]:
        """Workload weights over the measured levels, normalised to sum to 1."""
        raw = self.workload.weights or {c: 1.0 for c in self.levels}
        total = sum(raw.values())
        return {c: w / total for c, w in raw.items()}

    def spec_hash(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def kernel_binary(self) -> Path:
        return self.kernel.binary or self.server.binary.with_name("llama-batched-bench")


def default_levels(n_parallel: int) -> list[int]:
    """1, 2, 4, ... up to and including n_parallel."""
    levels, c = [], 1
    while c < n_parallel:
        levels.append(c)
        c *= 2
    levels.append(n_parallel)
    return levels


def _resolve_refs(value: Any, resolve: Callable[[str], str]) -> Any:
    if isinstance(value, str) and value.startswith(BENCH_PREFIX):
        return resolve(value[len(BENCH_PREFIX) :])
    if isinstance(value, list):
        return [_resolve_refs(v, resolve) for v in value]
    if isinstance(value, dict):
        return {k: _resolve_refs(v, resolve) for k, v in value.items()}
    return value


def _uses_bench(value: Any) -> bool:
    if isinstance(value, str):
        return value.startswith(BENCH_PREFIX)
    if isinstance(value, list):
        return any(_uses_bench(v) for v in value)
    if isinstance(value, dict):
        return any(_uses_bench(v) for v in value.values())
    return False


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {part} is not a table")
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`workload.max_repeats=2` -> ("workload.max_repeats", 2); values are TOML, else strings."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. workload.max_repeats=2")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def load_spec(
    path: Path,
    overrides: list[tuple[str, Any]] | None = None,
    bench_refs: Callable[[], dict[str, Path]] | None = None,
    check_files: bool = True,
) -> ProfileSpec:
    """Read, resolve and validate a spec; every problem is one ConfigError line naming the field."""
    data = read_toml(path, "spec file")
    for key, value in overrides or []:
        set_dotted(data, key, value)
    if _uses_bench(data):
        if bench_refs is None:
            raise ConfigError(f"{path} uses bench: paths but no bench is configured")
        refs = bench_refs()

        def resolve(name: str) -> str:
            if name not in refs:
                raise ConfigError(
                    f"{path}: unknown bench path 'bench:{name}' (known: {', '.join(refs)})"
                )
            return str(refs[name])

        data = _resolve_refs(data, resolve)
    _resolve_prompts(data, path)
    try:
        spec = ProfileSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc)) from exc
    if check_files:
        check_spec_files(spec, str(path))
    return spec


def _resolve_prompts(data: dict[str, Any], spec_path: Path) -> None:
    """A prompts file: its path made absolute (relative paths are the spec file's), read and
    checked now, before anything is measured or stored, and its hash recorded in the spec."""
    workload = data.get("workload")
    if not isinstance(workload, dict) or not workload.get("prompts"):
        return
    if not isinstance(workload["prompts"], str):
        raise ConfigError(f"{spec_path}: workload.prompts: expected a file path")
    prompts, sha = prompt_file(
        workload["prompts"], spec_path.parent, f"{spec_path}: workload.prompts"
    )
    workload["prompts"], workload["prompts_sha256"] = str(prompts), sha


def prompt_file(value: str, base: Path, where: str) -> tuple[Path, str]:
    """A prompts file's absolute path (a relative one is base's) and its content hash, the file
    read and checked; any problem is one ConfigError line that starts with where."""
    path = Path(value).expanduser()
    path = (path if path.is_absolute() else base / path).resolve()
    try:
        return path, load_prompts(path).sha256
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def check_spec_files(spec: ProfileSpec, source: str) -> None:
    """The binary must exist and the model must be a GGUF file (or a twin world, whose own
    model name the spec must use: the stored data of two worlds never pool)."""
    if not spec.server.binary.exists():
        raise ConfigError(f"{source}: server.binary: file not found: {spec.server.binary}")
    require_gguf(spec.server.model, f"{source}: server.model")
    if spec.server.model.suffix == TWIN_SUFFIX:
        own = twin_model_name(spec.server.model, f"{source}: server.model")
        if spec.model_name != own:
            raise ConfigError(
                f"{source}: model_name {spec.model_name!r} is not the twin world's own "
                f"({own!r} in {spec.server.model}): use it, so that measurements "
                "of two worlds are never stored under one name"
            )


def attached_spec(
    label: str,
    model_name: str,
    model_path: Path,
    slots: int,
    source: str,
    base: ProfileSpec | None = None,
    overrides: list[tuple[str, Any]] | None = None,
    slot_context: int | None = None,
) -> ProfileSpec:
    """The spec an attached server is measured under: its own slots, context per slot and model,
    the workload of base (a spec file) or of the overrides; a level above its slots or a depth
    beyond its context is an error."""
    server: dict[str, Any] = {"binary": "(attached)", "model": str(model_path), "n_parallel": slots}
    if slot_context:
        server["ctx_size"] = slot_context * slots
    data: dict[str, Any] = {
        "name": f"attach-{label}",
        "model_name": model_name,
        "server": server,
        "speculative": {"args": []},
        "kernel": {"enabled": False},
    }
    if base is not None:
        data["workload"] = base.workload.model_dump()
    for key, value in overrides or []:
        set_dotted(data, key, value)
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(source, exc)) from exc


RUNNING_BINARY = "(running)"  # a running server's spec names no binary: the tuner starts none


def running_spec(
    name: str,
    model_name: str,
    model_path: Path,
    slots: int,
    n_max: int,
    source: str,
    overrides: list[tuple[str, Any]] | None = None,
    slot_context: int | None = None,
    url: str | None = None,
    plain_url: str | None = None,
) -> ProfileSpec:
    """The spec a running patched server is tuned under (`tune --url`): its own slots, context
    per slot, model and draft length, the default workload at levels 1, 2, 4, ... up to its
    slots (`--set workload.KEY=VALUE` overrides come last), and the URLs it was measured at."""
    server: dict[str, Any] = {
        "binary": RUNNING_BINARY,
        "model": str(model_path),
        "n_parallel": slots,
        "url": url,
        "plain_url": plain_url,
    }
    if slot_context:
        server["ctx_size"] = slot_context * slots
    data: dict[str, Any] = {
        "name": name,
        "model_name": model_name,
        "server": server,
        "speculative": {"args": [], "n_max": n_max},
        "kernel": {"enabled": False},
        "workload": {"concurrency": default_levels(slots)},
    }
    for key, value in overrides or []:
        set_dotted(data, key, value)
    try:
        return ProfileSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(source, exc)) from exc
