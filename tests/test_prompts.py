"""The user's prompts: reading prompt files, keyed draws, output lengths, and what the load
generator sends for each kind of prompt. Pure: no server."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.measure.load import (
    CHAT_PATH,
    COMPLETION_PATH,
    LoadGenerator,
    Workload,
    is_final_chunk,
    tokens_so_far,
)
from tuner.measure.prompts import OutputLengths, Prompt, draw_prompt, draw_rng, load_prompts
from tuner.measure.spec import OutputSpec, load_spec

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_jsonl_of_prompts_and_chats_and_a_text_file(tmp_path: Path) -> None:
    jsonl = write(
        tmp_path,
        "mixed.jsonl",
        '{"prompt": "Tell me about tides."}\n\n'
        '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40}\n',
    )
    prompts = load_prompts(jsonl)
    assert len(prompts) == 2
    assert prompts.prompts[0] == Prompt(text="Tell me about tides.")
    assert prompts.prompts[1].is_chat and prompts.prompts[1].max_tokens == 40
    text = load_prompts(write(tmp_path, "lines.txt", "first prompt\n\n  second prompt  \n"))
    assert [p.text for p in text.prompts] == ["first prompt", "second prompt"]
    # The hash follows the content: another file, another set.
    assert load_prompts(jsonl).sha256 == prompts.sha256 != text.sha256


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("empty.jsonl", "\n  \n", "the prompt file is empty"),
        ("latin1.txt", "caf\xe9\n".encode("latin-1"), "not UTF-8"),
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": "unterminated\n', "line 2: not JSON"),
        ("keys.jsonl", '{"text": "x"}\n', 'line 1: needs "prompt" or "messages" (keys: text)'),
        ("list.jsonl", '["a"]\n', 'line 1: expected an object with "prompt" or "messages"'),
        ("blank.jsonl", '{"prompt": "  "}\n{"messages": []}\n', "no usable prompt"),
        ("length.jsonl", '{"prompt": "a", "max_tokens": 0}\n', '"max_tokens" must be a positive'),
        ("roles.jsonl", '{"messages": [{"content": "x"}]}\n', '"messages" must be a list'),
    ],
)
def test_a_bad_prompt_file_is_one_line_naming_it(
    tmp_path: Path, name: str, content: str | bytes, fragment: str
) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(ConfigError) as err:
        load_prompts(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and fragment in message, message


def test_a_missing_prompt_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="prompt file not found"):
        load_prompts(tmp_path / "nope.jsonl")


def test_draws_are_keyed_by_level_round_and_stream(tmp_path: Path) -> None:
    prompts = load_prompts(write(tmp_path, "p.txt", "\n".join(f"prompt {i}" for i in range(50))))

    def drawn(seed: int, c: int, r: int) -> list[str | None]:
        return [draw_prompt(prompts, draw_rng(seed, c, r, i)).text for i in range(c)]

    # The same key draws the same prompts, whatever was drawn before (so paired configurations
    # of a pass and a resumed run see what the others saw) ...
    assert drawn(0, 4, 1) == drawn(0, 4, 1)
    # ... and other rounds, levels and seeds draw others.
    assert drawn(0, 4, 1) != drawn(0, 4, 2)
    assert drawn(0, 4, 1) != drawn(1, 4, 1)
    assert len(set(drawn(0, 8, 0)) | set(drawn(0, 8, 1))) > 8


def test_output_lengths_follow_their_distribution() -> None:
    rng = draw_rng(0, 1, 0, 0)
    assert OutputLengths("fixed", 192).draw(rng, None) == 192
    uniform = [OutputLengths("uniform", 0, 64, 256).draw(rng, None) for _ in range(2000)]
    assert min(uniform) >= 64 and max(uniform) <= 256
    assert statistics.mean(uniform) == pytest.approx(160, rel=0.05)
    lognormal = OutputLengths("lognormal", 0, 16, 1024, 128, 0.6)
    drawn = [lognormal.draw(rng, None) for _ in range(2000)]
    assert statistics.median(drawn) == pytest.approx(128, rel=0.1)
    assert min(drawn) >= 16 and max(drawn) <= 1024 and statistics.pstdev(drawn) > 40
    from_file = OutputLengths("file", 96)
    assert from_file.draw(rng, Prompt(text="x", max_tokens=33)) == 33
    assert from_file.draw(rng, Prompt(text="x")) == 96


def test_output_spec_needs_its_parameters() -> None:
    with pytest.raises(ValueError, match="uniform needs max"):
        OutputSpec(distribution="uniform")
    with pytest.raises(ValueError, match="lognormal needs median"):
        OutputSpec(distribution="lognormal")
    with pytest.raises(ValueError, match="below min"):
        OutputSpec(distribution="uniform", min=100, max=50)


def test_the_generator_sends_chats_to_the_chat_endpoint_and_text_to_completion(
    tmp_path: Path,
) -> None:
    prompts = load_prompts(
        write(
            tmp_path,
            "p.jsonl",
            '{"messages": [{"role": "user", "content": "Repeat: x = 1"}], "max_tokens": 24}\n',
        )
    )
    chat = LoadGenerator(
        "http://127.0.0.1:9", Workload(prompts=prompts, output=OutputLengths("file", 64))
    )
    request = asyncio.run(chat._request(None, 2, 0, 1))  # type: ignore[arg-type]
    assert request.path == CHAT_PATH and request.is_chat
    assert request.body["messages"][0]["content"] == "Repeat: x = 1"
    assert request.body["max_tokens"] == 24 and request.body["timings_per_token"] is True
    assert request.body["ignore_eos"] is True and request.body["cache_prompt"] is False
    text = load_prompts(write(tmp_path, "t.txt", "Write about rivers.\n"))
    plain = LoadGenerator("http://127.0.0.1:9", Workload(prompts=text, max_tokens=50))
    request = asyncio.run(plain._request(None, 1, 0, 0))  # type: ignore[arg-type]
    assert request.path == COMPLETION_PATH
    assert request.body["prompt"] == "Write about rivers." and request.body["n_predict"] == 50


def test_streamed_chunks_of_both_endpoints() -> None:
    assert tokens_so_far({"content": "a", "tokens_predicted": 7, "stop": False}) == 7
    chat_partial = {
        "choices": [{"delta": {"content": "a"}, "finish_reason": None}],
        "timings": {"predicted_n": 5},
    }
    assert tokens_so_far(chat_partial) == 5 and not is_final_chunk(chat_partial)
    chat_final = {"choices": [{"delta": {}, "finish_reason": "length"}], "timings": {}}
    assert is_final_chunk(chat_final)
    assert is_final_chunk({"stop": True}) and not is_final_chunk({"stop": False})
    assert tokens_so_far({"choices": [{"delta": {"role": "assistant"}}]}) == 0


def test_a_spec_resolves_its_prompt_file_and_records_its_hash(tmp_path: Path) -> None:
    spec_path = REPO / "profiles" / "bench-smollm2-cpu.toml"
    write(tmp_path, "mine.jsonl", json.dumps({"prompt": "hello"}) + "\n")
    text = spec_path.read_text().replace(
        "[workload]", '[workload]\nprompts = "mine.jsonl"\nseed = 3', 1
    )
    path = write(tmp_path, "spec.toml", text)
    refs = {k: tmp_path / k for k in ("llama-server", "target", "draft")}
    spec = load_spec(path, bench_refs=lambda: refs, check_files=False)
    assert spec.workload.prompts == tmp_path / "mine.jsonl"
    assert spec.workload.prompts_sha256 == load_prompts(tmp_path / "mine.jsonl").sha256
    assert spec.workload.seed == 3


def test_live_runs_refuse_a_prompt_file_that_changed_since_the_profile(tmp_path: Path) -> None:
    from tuner.decide.validate import validation_spec

    prompts = write(tmp_path, "mine.txt", "one prompt\n")
    text = (REPO / "profiles" / "bench-smollm2-cpu.toml").read_text()
    spec_path = write(
        tmp_path, "spec.toml", text.replace("[workload]", f'[workload]\nprompts = "{prompts}"')
    )
    refs = {k: tmp_path / k for k in ("llama-server", "target", "draft")}
    stored = load_spec(spec_path, bench_refs=lambda: refs, check_files=False).model_dump(
        mode="json"
    )
    same = validation_spec(stored, [1], None)
    assert same.workload.prompts_sha256 == stored["workload"]["prompts_sha256"]
    prompts.write_text("another prompt\n")
    with pytest.raises(ConfigError, match="changed since the profile measured it"):
        validation_spec(stored, [1], None)
    prompts.unlink()
    with pytest.raises(ConfigError, match="prompt file not found"):
        validation_spec(stored, [1], None)


def test_a_fit_never_mixes_two_prompt_sets(tmp_path: Path) -> None:
    from benchdata import store_profile

    from tuner.storage.fits import acceptance_by_prompt_set, select_data
    from tuner.storage.store import Store

    store = Store(f"sqlite:///{tmp_path / 'tuner.db'}")
    code = {"prompts": "/p/code.jsonl", "prompts_sha256": "c" * 64}
    prose = {"prompts": "/p/prose.jsonl", "prompts_sha256": "d" * 64}
    first = store_profile(store, workload=code)
    second = store_profile(store, workload=prose)
    _, selection = select_data(store, "smollm2-bench", None)
    assert selection.run_ids == [second]
    assert selection.workload is not None and "prose.jsonl (dddddddd)" in selection.workload
    third = store_profile(store, workload=code)
    _, selection = select_data(store, "smollm2-bench", None)
    assert selection.run_ids == [first, third]
    # Acceptance is shown per prompt set, each from its own runs.
    by_set = acceptance_by_prompt_set(store, "smollm2-bench")
    assert sorted(by_set) == ["prompts code.jsonl (cccccccc)", "prompts prose.jsonl (dddddddd)"]
    assert all(3.0 < v < 4.5 for v in by_set.values()), by_set  # the bench table's spec levels
    store.dispose()


def test_context_depths_must_fit_the_kv_cache(tmp_path: Path) -> None:
    spec_path = REPO / "profiles" / "bench-smollm2-cpu.toml"
    refs = {k: tmp_path / k for k in ("llama-server", "target", "draft")}

    def load(*overrides: tuple[str, object]) -> object:
        return load_spec(spec_path, list(overrides), bench_refs=lambda: refs, check_files=False)

    spec = load(
        ("workload.context_tokens", [1024, 0, 256, 256]),
        ("server.ctx_size", 9728),
        ("workload.max_tokens", 192),
    )
    assert spec.workload.context_tokens == [0, 256, 1024]  # sorted, once each
    # --kv-unified: the 8 streams of the top level share ctx_size 4096, 512 each
    with pytest.raises(ConfigError, match=r"depth 1024 plus up to 192 output tokens needs 1216"):
        load(
            ("workload.context_tokens", [0, 1024]),
            ("server.ctx_size", 8192),
            ("workload.max_tokens", 192),
        )
    assert load(
        ("workload.context_tokens", [0, 1024]),
        ("server.ctx_size", 9728),
        ("workload.max_tokens", 192),
    )
    with pytest.raises(ConfigError, match="context depths are token counts"):
        load(("workload.context_tokens", [-1]))
    with pytest.raises(ConfigError, match="needs at least one depth"):
        load(("workload.context_tokens", []))
