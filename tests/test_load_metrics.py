"""Pure pieces of measuring: sample summaries, spreads, /metrics parsing, kernel rows, levels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.measure import kernel, metrics
from tuner.measure.load import (
    STALL_MIN_S,
    RequestSample,
    never_together,
    stall_pause,
    summarize,
)
from tuner.measure.metrics import parse_metrics
from tuner.measure.spec import SpeculativeSpec, default_levels
from tuner.measure.stats import relative_mad

METRICS_BEFORE = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 100
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 10
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 5
"""
METRICS_AFTER = """\
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 400
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 110
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 200
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 130
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 3.5
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 88
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 55
"""


def _sample(stream: int, start: float, step: float, n: int, accepted: int = 0) -> RequestSample:
    times = [start + step * i for i in range(n)]
    return RequestSample(
        stream=stream,
        ok=True,
        tokens=n,
        generation_ms=step * (n - 1) * 1000,
        draft_accepted=accepted,
        start=start - 0.1,
        token_times=times,
    )


def test_summarize_counts_only_the_window_where_all_streams_generate() -> None:
    # Stream 0 starts early and runs alone for a while; stream 1 joins 1 s later.
    a = _sample(0, start=0.0, step=0.01, n=300)  # 0.00 .. 2.99 s
    b = _sample(1, start=1.0, step=0.02, n=100)  # 1.00 .. 2.98 s
    figures = summarize([a, b], concurrency=2)
    window = 2.98 - 1.0
    tokens_a = sum(1 for t in a.token_times if 1.0 < t <= 2.98)
    tokens_b = sum(1 for t in b.token_times if 1.0 < t <= 2.98)
    assert figures.window_tokens == tokens_a + tokens_b
    assert figures.tokens_per_second == pytest.approx((tokens_a + tokens_b) / window)
    # ~100 tok/s + ~50 tok/s, not the blurred average over everyone's whole life.
    assert figures.tokens_per_second == pytest.approx(150, rel=0.02)
    assert figures.per_stream_tps == pytest.approx(figures.tokens_per_second / 2)


def test_a_round_whose_streams_never_generated_together_is_told_apart() -> None:
    a = _sample(0, start=0.0, step=0.01, n=100)  # 0.00 .. 0.99 s
    late = _sample(1, start=1.5, step=0.01, n=100)  # starts after a finished
    overlapping = _sample(1, start=0.5, step=0.01, n=100)
    assert never_together([a, late], 2)
    assert summarize([a, late], 2).window_ms is None  # the fallback figure, sum of the rates
    assert not never_together([a, overlapping], 2)
    assert summarize([a, overlapping], 2).window_ms is not None
    # one stream, a failed stream, or a one-token output: nothing to tell
    assert not never_together([a], 1)
    assert not never_together([a, _sample(1, start=1.5, step=0.01, n=1)], 2)
    assert not never_together([a, RequestSample(stream=1, ok=False, error="x")], 2)


def _paused(sample: RequestSample, at: float, pause: float) -> RequestSample:
    """The sample with every token from time `at` on delayed by `pause` seconds."""
    sample.token_times = [t + pause if t >= at else t for t in sample.token_times]
    return sample


def test_a_pause_in_which_no_stream_got_a_token_is_a_stall_and_a_slow_spell_is_not() -> None:
    def two(step: float = 0.02, n: int = 200) -> list[RequestSample]:
        return [_sample(0, 0.0, step, n), _sample(1, 0.005, step, n)]  # ~4 s window

    assert stall_pause(two(), 2) is None
    stalled = [_paused(s, 2.0, 3.0) for s in two()]  # the machine froze 3 s mid-round
    assert stall_pause(stalled, 2) == pytest.approx(3.0 + 0.02 - 0.005, abs=1e-9)
    # both streams slowed to a third for the middle half: every step longer, no pause
    spell = two()
    for s in spell:
        s.token_times = [t if t < 1 else 1 + (t - 1) * 3 if t < 3 else t + 4 for t in s.token_times]
    assert stall_pause(spell, 2) is None
    # one stream paused while the other went on: the server was working
    assert stall_pause([_paused(_sample(0, 0.0, 0.02, 200), 2.0, 3.0), two()[1]], 2) is None
    # a pause under STALL_MIN_S, or under a quarter of a long window, is left to the statistics
    assert stall_pause([_paused(s, 2.0, STALL_MIN_S * 0.8) for s in two()], 2) is None
    long = [_paused(s, 2.0, 1.5) for s in two(step=0.1, n=200)]  # 20 s window
    assert stall_pause(long, 2) is None
    # no window: nothing to tell
    assert stall_pause([_paused(_sample(0, 0.0, 0.02, 200), 2.0, 3.0)], 2) is None


def test_summarize_steps_and_acceptance() -> None:
    s = _sample(0, start=0.0, step=0.01, n=101, accepted=51)  # 50 server steps for 101 tokens
    figures = summarize([s], concurrency=1)
    assert s.steps == 50
    assert figures.step_ms == pytest.approx(1000 / 50)
    assert figures.accept_len == pytest.approx(101 / 50)


def test_summarize_keeps_failures_apart() -> None:
    good = _sample(0, start=0.0, step=0.01, n=50)
    bad = RequestSample(stream=1, ok=False, error="ReadTimeout")
    figures = summarize([good, bad], concurrency=2)
    assert (figures.ok, figures.failed) == (1, 1)
    # With a stream missing there is no all-streams window: fall back to the streams' own rates.
    assert figures.window_tokens is None
    assert figures.tokens_per_second == pytest.approx(50 / 0.49)
    assert summarize([bad], concurrency=1).tokens_per_second is None


def test_relative_mad() -> None:
    assert relative_mad([10.0]) is None
    assert relative_mad([10.0, 10.0, 10.0]) == 0
    assert relative_mad([9.0, 10.0, 12.0]) == pytest.approx(1 / 10)


def test_metrics_delta_and_drafting_summary() -> None:
    before = parse_metrics(METRICS_BEFORE)
    after = parse_metrics(METRICS_AFTER)
    diff = after.since(before)
    assert diff["tokens_predicted_total"] == 300
    assert diff["n_busy_slots_per_decode"] == 3.5  # a gauge keeps its later value
    summary = metrics.drafting_summary(diff)
    assert summary["drafts"] == 100
    assert summary["accepted_per_position"] == [80, 50]
    assert summary["accept_rates"] == [0.8, 0.5]  # E[L] = 1 + 0.8 + 0.5


def test_kernel_jsonl_gives_decode_and_verify_points() -> None:
    line = (
        '{"n_kv_max": 4096, "pp": 4, "tg": 16, "pl": 2, "n_kv": 40, "t_pp": 0.05, '
        '"speed_pp": 160.0, "t_tg": 0.64, "speed_tg": 50.0, "t": 0.69, "speed": 58.0}'
    )
    points = kernel.parse_jsonl("build info line\n" + line + "\n")
    verify, decode = points
    assert (verify.shape, verify.n_seq, verify.tokens_per_seq, verify.rows) == ("verify", 2, 4, 8)
    assert verify.step_ms == pytest.approx(50.0)
    assert (decode.shape, decode.rows) == ("decode", 2)
    assert decode.step_ms == pytest.approx(40.0)


def test_kernel_jsonl_of_the_draft_model_gives_its_generation_steps() -> None:
    line = (
        '{"n_kv_max": 40, "pp": 1, "tg": 16, "pl": 3, "n_kv": 51, "t_pp": 0.01, '
        '"speed_pp": 300.0, "t_tg": 0.112, "speed_tg": 428.6, "t": 0.122, "speed": 418.0}'
    )
    (draft,) = kernel.parse_jsonl(line, model="draft")
    assert (draft.shape, draft.n_seq, draft.rows) == ("draft", 3, 3)
    assert draft.step_ms == pytest.approx(7.0)
    cmd = kernel.draft_command(Path("/b/llama-batched-bench"), Path("/m/d.gguf"), 4, 2, 16, [])
    assert cmd[cmd.index("-m") + 1] == "/m/d.gguf" and cmd[cmd.index("-npl") + 1] == "1,2,3,4"
    assert cmd[cmd.index("-npp") + 1] == "1" and cmd[cmd.index("-t") + 1] == "2"


def test_full_draft_prompt_batches_are_measured_again_alone() -> None:
    cmd = kernel.prompt_command(Path("/b/bb"), Path("/m/t.gguf"), 3, 6, 4096, None, 2, [])
    assert cmd[cmd.index("-npp") + 1] == "7" and cmd[cmd.index("-ntg") + 1] == "4"
    assert cmd[cmd.index("-npl") + 1] == "1,2,3,1,2,3" and "-t" not in cmd
    line = (
        '{"n_kv_max": 40, "pp": 7, "tg": 4, "pl": 3, "n_kv": 33, "t_pp": 0.06, '
        '"speed_pp": 350.0, "t_tg": 0.12, "speed_tg": 100.0, "t": 0.18, "speed": 183.0}'
    )
    verify, decode = kernel.parse_jsonl(line, model="prompts")
    assert (verify.shape, verify.rows, verify.step_ms) == ("verify", 21, pytest.approx(60.0))
    assert (decode.shape, decode.rows, decode.step_ms) == ("decode", 3, pytest.approx(30.0))


def test_the_draft_model_is_read_from_the_drafting_arguments() -> None:
    def draft(*args: str) -> Path | None:
        return SpeculativeSpec(args=["--spec-type", "draft-simple", *args]).draft_model()

    assert draft("--model-draft", "/m/d.gguf", "--spec-synth-len", "3") == Path("/m/d.gguf")
    assert draft("-md", "/m/e.gguf") == Path("/m/e.gguf")
    assert draft("--model-draft=/m/f.gguf") == Path("/m/f.gguf")
    assert SpeculativeSpec(args=["--spec-type", "ngram-simple"]).draft_model() is None
    assert draft("--model-draft") is None  # nothing after it: llama-server's own error to give


def test_a_draft_model_without_a_speculative_type_is_refused() -> None:
    """llama.cpp 11434 loads a draft model given alone and never drafts: a spec that asks for
    drafting that way would measure plain under every drafting policy's name."""
    with pytest.raises(ValueError, match="--spec-type draft-simple"):
        SpeculativeSpec(args=["--model-draft", "/m/d.gguf"])


def test_kernel_verify_lengths_cover_the_draft() -> None:
    assert kernel.verify_lengths(6) == [2, 4, 7]
    assert kernel.verify_lengths(3) == [2, 3, 4]
    assert kernel.verify_lengths(1) == [2]


def test_default_levels() -> None:
    assert default_levels(8) == [1, 2, 4, 8]
    assert default_levels(6) == [1, 2, 4, 6]
    assert default_levels(1) == [1]


def test_summarize_counts_drafts_made_inside_the_window_only() -> None:
    a = _sample(0, start=0.0, step=0.01, n=300)  # 0.00 .. 2.99 s
    b = _sample(1, start=1.0, step=0.02, n=100)  # 1.00 .. 2.98 s: the window
    # stream 0's counter grows by 3 at 0.5 s (before), 1.5 and 2.0 s (inside), 2.99 s (after)
    a.token_drafts = [3 * sum(i >= k for k in (50, 150, 200, 299)) for i in range(300)]
    # stream 1's by 4 at 2.0 s
    b.token_drafts = [0 if i < 50 else 4 for i in range(100)]
    assert summarize([a, b], concurrency=2).window_drafted == 6 + 4
    # without a counter per token (not streamed, or an older record) it cannot tell
    b.token_drafts = []
    assert summarize([a, b], concurrency=2).window_drafted is None
