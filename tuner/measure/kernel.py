"""Kernel-level step costs from `llama-batched-bench --output-format jsonl`.

One run on the target measures both shapes the server executes: generation steps of n_seq x 1
rows (decode) and prompt batches of n_seq x (n+1) rows (the verify shape of a draft of n tokens).
They give the shape of T(rows) cheaply; server-level runs calibrate what the bare kernels miss.
A second run repeats the prompt batches of a full draft (n_max + 1 tokens a sequence, each count
`repeats` times, with PROMPT_RUN_STEPS decode steps after each): a prompt batch is one call, and
one measurement of it spreads 10-15 % on this 2-core VM, so the rows of the step that verifies
full drafts are the median of several, and so are the decode rows (a spell of the machine hit two
of the first run's three decode measurements at 5 sequences once, 44-49 ms against 35-39 at 4
and 6). A third, short run on the draft model (where the spec loads
one) measures its generation steps of n_seq x 1 rows ("draft"): the shape of a draft call's cost
in the number of drafting slots, which on a CPU is not smooth (the bench's one-block draft costs
more at 3, 5 and 7 rows than at 4, 6 and 8).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ServerDiedError, ServerError
from tuner.measure.spec import ProfileSpec


@dataclass(frozen=True)
class KernelPoint:
    shape: str  # "decode" (n_seq x 1), "verify" (n_seq x tokens_per_seq), "draft" (draft model)
    n_seq: int
    tokens_per_seq: int
    step_ms: float

    @property
    def rows(self) -> int:
        return self.n_seq * self.tokens_per_seq


def verify_lengths(n_max: int) -> list[int]:
    """Draft-plus-one lengths to measure: a few spread over 2..n_max+1 (cost is near-linear)."""
    top = n_max + 1
    return sorted({2, (top + 2) // 2, top}) if top > 2 else [2]


def _batched_bench(
    binary: Path,
    model: Path,
    n_ctx: int,
    prompt_lengths: list[int],
    generation_tokens: int,
    counts: list[int],
    threads: int | None,
    extra_args: list[str],
) -> list[str]:
    """One llama-batched-bench command line: every prompt length x every sequence count."""
    cmd = [str(binary), "-m", str(model), "-c", str(n_ctx)]
    cmd += ["-npp", ",".join(map(str, prompt_lengths)), "-ntg", str(generation_tokens)]
    cmd += ["-npl", ",".join(map(str, counts)), "--output-format", "jsonl"]
    if threads:
        cmd += ["-t", str(threads)]
    return cmd + extra_args


def command(
    binary: Path,
    model: Path,
    n_parallel: int,
    n_max: int,
    ctx_size: int,
    threads: int | None,
    generation_tokens: int,
    extra_args: list[str],
) -> list[str]:
    """The target's verify lengths and decode steps at 1..n_parallel sequences."""
    lengths = verify_lengths(n_max)
    n_ctx = max(ctx_size, n_parallel * (max(lengths) + generation_tokens) + 16)
    counts = list(range(1, n_parallel + 1))
    return _batched_bench(
        binary, model, n_ctx, lengths, generation_tokens, counts, threads, extra_args
    )


PROMPT_RUN_STEPS = 4  # decode steps after each repeated prompt batch: more decode rows, cheaply


def prompt_command(
    binary: Path,
    model: Path,
    n_parallel: int,
    n_max: int,
    ctx_size: int,
    threads: int | None,
    repeats: int,
    extra_args: list[str],
) -> list[str]:
    """Prompt batches of n_max + 1 tokens a sequence, each count `repeats` times, each followed
    by PROMPT_RUN_STEPS decode steps."""
    n_ctx = max(ctx_size, n_parallel * (n_max + 1 + PROMPT_RUN_STEPS) + 16)
    counts = [c for _ in range(repeats) for c in range(1, n_parallel + 1)]
    return _batched_bench(
        binary, model, n_ctx, [n_max + 1], PROMPT_RUN_STEPS, counts, threads, extra_args
    )


def draft_command(
    binary: Path,
    draft_model: Path,
    n_parallel: int,
    threads: int | None,
    generation_tokens: int,
    extra_args: list[str],
) -> list[str]:
    """The draft model's generation steps at 1..n_parallel sequences (one-token prompts)."""
    n_ctx = n_parallel * (1 + generation_tokens) + 16
    counts = list(range(1, n_parallel + 1))
    return _batched_bench(
        binary, draft_model, n_ctx, [1], generation_tokens, counts, threads, extra_args
    )


def runs(
    binary: Path,
    target: Path,
    draft: Path | None,
    n_parallel: int,
    n_max: int,
    ctx_size: int,
    threads: int | None,
    generation_tokens: int,
    prompt_repeats: int,
    extra_args: list[str],
) -> list[tuple[list[str], str, str]]:
    """A profile's kernel runs as (command, log name, `parse_jsonl` model): the target's, its
    full-draft prompt batches again (when prompt_repeats > 0), the draft model's (when given)."""
    out = [
        (
            command(
                binary, target, n_parallel, n_max, ctx_size, threads, generation_tokens, extra_args
            ),
            "kernel.log",
            "target",
        )
    ]
    if prompt_repeats:
        cmd = prompt_command(
            binary, target, n_parallel, n_max, ctx_size, threads, prompt_repeats, extra_args
        )
        out.append((cmd, "kernel-prompts.log", "target"))
    if draft is not None:
        cmd = draft_command(binary, draft, n_parallel, threads, generation_tokens, extra_args)
        out.append((cmd, "kernel-draft.log", "draft"))
    return out


def parse_jsonl(text: str, model: str = "target") -> list[KernelPoint]:
    """Every jsonl line of the target (`prompt_command`'s too) gives one verify point (its prompt
    batch) and one decode point; of the draft model (`model="draft"`), one draft point (its
    generation steps)."""
    points: list[KernelPoint] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        pl, pp, tg = int(row["pl"]), int(row["pp"]), int(row["tg"])
        step_ms = float(row["t_tg"]) * 1000 / tg if tg > 0 else None
        if model == "draft":
            if step_ms is not None:
                points.append(KernelPoint("draft", pl, 1, step_ms))
            continue
        points.append(KernelPoint("verify", pl, pp, float(row["t_pp"]) * 1000))
        if step_ms is not None:
            points.append(KernelPoint("decode", pl, 1, step_ms))
    return points


def run_batched_bench(
    cmd: list[str], log_path: Path, timeout_s: float = 600, model: str = "target"
) -> list[KernelPoint]:
    """Run llama-batched-bench and parse its rows (`parse_jsonl`'s model); its output is kept in
    log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"llama-batched-bench did not finish within {timeout_s:.0f} s") from exc
    except OSError as exc:
        raise ServerError(f"cannot run llama-batched-bench: {exc}") from exc
    log_path.write_text("$ " + " ".join(cmd) + "\n" + result.stdout + "\n" + result.stderr)
    if result.returncode != 0:
        from tuner.measure.launcher import describe_exit

        what, cause = describe_exit(result.returncode)
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-10:])
        raise ServerDiedError(
            f"llama-batched-bench {what}" + (f" ({cause})" if cause else "") + f":\n{tail}",
            returncode=result.returncode,
        )
    points = parse_jsonl(result.stdout + "\n" + result.stderr, model)
    if not points:
        raise ServerError(f"llama-batched-bench printed no jsonl rows; see {log_path}")
    return points


def measure_spec(
    spec: ProfileSpec, logs: Path, say: Callable[[str, str], None]
) -> list[KernelPoint] | None:
    """The spec's kernel level (`runs`, each run's log under logs): its points, or None where
    the spec turns it off or its llama-batched-bench is missing (said: ("message", why)).
    say(kind, text) reports progress."""
    binary = spec.kernel_binary()
    if not spec.kernel.enabled:
        return None
    if not binary.exists():
        say("message", f"no {binary.name}: kernel level skipped")
        return None
    say("kernel", "kernel level: llama-batched-bench")
    draft = spec.speculative.draft_model()
    points: list[KernelPoint] = []
    for cmd, log, model in runs(
        binary,
        spec.server.model,
        draft if draft is not None and draft.exists() else None,
        spec.server.n_parallel,
        spec.speculative.n_max,
        spec.server.ctx_size,
        spec.server.threads,
        spec.kernel.generation_tokens,
        spec.kernel.prompt_repeats,
        spec.kernel.args,
    ):
        points += run_batched_bench(cmd, logs / log, model=model)
    return points
