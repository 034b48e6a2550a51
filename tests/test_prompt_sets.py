"""The user's prompts on the real bench: chat prompts from a file reach the server through its
chat endpoint, and what an n-gram drafter accepts follows the text.

The regime is profiles/bench-smollm2-cpu-ngram.toml (the F32 target drafting by n-gram lookup,
no synthetic acceptance) with its two bundled prompt sets. Greedy decoding makes acceptance a
property of the text, not of the machine's load: "repeat this code" copies its prompt and
accepts a large share of its drafts; "write a new story" has nothing to copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PROFILES
from sqlalchemy import select
from tunerproc import run_tuner, tuner_env, tuner_json

from tuner.measure.prompts import load_prompts
from tuner.storage.orm import Level, Run, Sample
from tuner.storage.store import Store

pytestmark = pytest.mark.bench

SPEC = PROFILES / "bench-smollm2-cpu-ngram.toml"
MODEL = "smollm2-135m-f32-ngram"
# Two levels (a fit needs two), one repeat each, no warm-up round, no preflight: acceptance is
# counted over every drafted token of every request, and 32 tokens of a copied module or of a
# new story are already far apart (64 tokens measured a mean accepted length of 3.1 for the
# code against the 1.3 asked for below).
QUICK = [
    "--skip-preflight",
    "--levels",
    "1,2",
    "--budget",
    "0",
    "--set",
    "workload.max_tokens=32",
    "--set",
    "workload.min_repeats=1",
    "--set",
    "workload.max_repeats=1",
    "--set",
    "workload.warmup=0",
    "--set",
    "kernel.enabled=false",
    "--set",
    "probes.enabled=false",
]


def profile_set(tmp_path: Path, name: str) -> tuple[str, dict]:
    db_url = f"sqlite:///{tmp_path / f'{name}.db'}"
    env = tuner_env(db_url, tmp_path / "cache")
    prompts = f'workload.prompts="prompts/{name}.jsonl"'
    result = run_tuner(["profile", str(SPEC), "--set", prompts, *QUICK], env, timeout_s=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return db_url, tuner_json(env, "dev", "fit", "--model", MODEL)


def test_acceptance_follows_the_prompt_set(tmp_path: Path) -> None:
    code_db, code = profile_set(tmp_path, "code-edit")
    _, stories = profile_set(tmp_path, "stories")

    # Each fit names the prompt file it was measured with.
    assert "code-edit.jsonl" in code["inputs"]["workload"]
    assert "stories.jsonl" in stories["inputs"]["workload"]
    # Repeating code accepts far more of the n-gram drafts than writing a new story.
    copy = code["quality"]["acceptance"]["mean_length"]
    fresh = stories["quality"]["acceptance"]["mean_length"]
    assert copy > 1.3 and fresh < 1.15 and copy - fresh > 0.25, (copy, fresh)
    print(f"mean accepted length: code-edit {copy:.3f}, stories {fresh:.3f}")

    # The prompts were the file's chats, through the chat template: every request of the code
    # set carries a prompt far longer than the synthetic one (32 tokens), and the stored spec
    # names the file by its content.
    store = Store(code_db)
    with store.session() as session:
        run = session.scalars(select(Run).where(Run.kind == "profile")).one()
        sha = run.spec["workload"]["prompts_sha256"]
        prompt_tokens = session.scalars(
            select(Sample.prompt_tokens).join(Level).where(Level.run_id == run.id)
        ).all()
    store.dispose()
    assert sha == load_prompts(PROFILES / "prompts" / "code-edit.jsonl").sha256
    assert prompt_tokens and min(prompt_tokens) > 100, prompt_tokens
