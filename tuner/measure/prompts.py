"""The user's own prompts: read a prompt file, draw prompts and output lengths reproducibly.

A prompt file is one of:
- JSONL (`.jsonl`/`.json`, or any file whose first non-blank line starts with `{`): one object per
  line, `{"prompt": "..."}` (sent to /completion) or OpenAI-style `{"messages": [...]}` (sent to
  /v1/chat/completions, so the model's chat template applies); `"max_tokens"` on a line gives
  that prompt's output length when the spec takes lengths from the file;
- plain text: one prompt per non-blank line.

Draws are keyed, not sequential: the prompt and output length of stream i in round r at
concurrency c come from a generator seeded with (seed, c, r, i). So every configuration measured
at a level in a round sees the same prompts (their difference is the server's, not the text's),
and a resumed run draws what the lost one would have.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    """One prompt: a completion prompt (text) or a chat (messages); its own output length."""

    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class PromptSet:
    """The prompts of one file and the file's content hash (which names the set in the store)."""

    path: Path
    prompts: tuple[Prompt, ...]
    sha256: str

    def __len__(self) -> int:
        return len(self.prompts)


def load_prompts(path: Path) -> PromptSet:
    """Read a prompt file; any problem is one ConfigError line naming the file (and the line)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"prompt file not found: {path}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read prompt file {path}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})"
        ) from exc
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise ConfigError(f"{path}: the prompt file is empty")
    first = next(line for line in lines if line.strip()).lstrip()
    jsonl = path.suffix.lower() in (".jsonl", ".json") or first.startswith("{")
    prompts = _jsonl_prompts(path, lines) if jsonl else _text_prompts(lines)
    if not prompts:
        raise ConfigError(f"{path}: no usable prompt (every line is empty)")
    return PromptSet(path, tuple(prompts), hashlib.sha256(raw).hexdigest())


def _text_prompts(lines: list[str]) -> list[Prompt]:
    return [Prompt(text=line.strip()) for line in lines if line.strip()]


def _jsonl_prompts(path: Path, lines: list[str]) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(record, dict):
            raise ConfigError(f'{where}: expected an object with "prompt" or "messages"')
        prompt = _record_prompt(record, where)
        if prompt is not None:
            prompts.append(prompt)
    return prompts


def _record_prompt(record: dict[str, Any], where: str) -> Prompt | None:
    """A line's prompt; None for an empty prompt (skipped, as a blank text line is)."""
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ConfigError(f'{where}: "max_tokens" must be a positive integer, got {max_tokens!r}')
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise ConfigError(
                f'{where}: "messages" must be a list of {{"role", "content"}} objects'
            )
        if not any(isinstance(m.get("content"), str) and m["content"].strip() for m in messages):
            return None
        return Prompt(messages=tuple(messages), max_tokens=max_tokens)
    if "prompt" in record:
        if not isinstance(record["prompt"], str):
            raise ConfigError(f'{where}: "prompt" must be a string')
        if not record["prompt"].strip():
            return None
        return Prompt(text=record["prompt"], max_tokens=max_tokens)
    keys = ", ".join(sorted(record)) or "none"
    raise ConfigError(f'{where}: needs "prompt" or "messages" (keys: {keys})')


def draw_rng(seed: int, concurrency: int, round_key: int, stream: int) -> random.Random:
    """The generator of one stream's draws (see the module docstring)."""
    return random.Random(f"{seed}:{concurrency}:{round_key}:{stream}")


def draw_prompt(prompts: PromptSet, rng: random.Random) -> Prompt:
    return prompts.prompts[rng.randrange(len(prompts))]


@dataclass(frozen=True)
class OutputLengths:
    """How long each request's output is: the spec's output section, resolved."""

    distribution: str = "fixed"  # fixed | uniform | lognormal | file
    fixed: int = 128
    min: int = 8
    max: int | None = None
    median: int | None = None
    sigma: float = 0.5

    def draw(self, rng: random.Random, prompt: Prompt | None) -> int:
        if self.distribution == "uniform":
            return rng.randint(self.min, self.max or self.fixed)
        if self.distribution == "lognormal":
            length = round(rng.lognormvariate(math.log(self.median or self.fixed), self.sigma))
            return max(self.min, min(self.max or 4 * (self.median or self.fixed), length))
        if self.distribution == "file" and prompt is not None and prompt.max_tokens:
            return prompt.max_tokens
        return self.fixed
