"""One answer on every surface: a Recommendation's kind (a threshold N, or plain: serve without
the draft model) and status are stated in the same words by every output form (env, shell,
systemd, args, json, text), and the commands it suggests fit how its data were measured.
Pure: recommendations made here, no server."""

from __future__ import annotations

import json

import pytest
from outputcheck import nonfinite_lines, suggestion_problem, suggestions

from tuner.decide.paired import Contrast
from tuner.policy import Policy
from tuner.recommendation import (
    ENV_MAX_SLOTS,
    PLAIN,
    THRESHOLD,
    Origin,
    OutputFormat,
    Reason,
    ReasonCode,
    Recommendation,
)
from tuner.report import tables


def answer(*codes: ReasonCode, **fields: object) -> Recommendation:
    reasons = [Reason(code, f"said: {code.value}") for code in codes]
    base: dict[str, object] = {
        "id": 7,
        "model": "qwen-q4",
        "host": "box",
        "policy": Policy.of_max_slots(2, 3),
        "fit_id": 1,
        "reasons": reasons,
        "source": "live",
    }
    return Recommendation(**{**base, **fields})  # type: ignore[arg-type]


def test_a_settled_threshold_reads_the_same_everywhere() -> None:
    rec = answer(ReasonCode.SETTLED)
    assert rec.kind == THRESHOLD and rec.status == "settled"
    assert rec.render(OutputFormat.ENV) == f"{ENV_MAX_SLOTS}=2"
    assert rec.render(OutputFormat.ARGS) == "--spec-draft-max-slots 2"
    assert rec.render(OutputFormat.TEXT) == rec.headline() == "N=2 (settled live)"
    data = json.loads(rec.render(OutputFormat.JSON))
    assert (data["answer"], data["status"], data["headline"]) == (
        THRESHOLD,
        "settled",
        "N=2 (settled live)",
    )
    assert data["drafting_pays"] is True
    assert rec.explain_lines()[0].startswith("recommendation 7 for qwen-q4: N=2 (settled live)")


@pytest.mark.parametrize("tune_n_max", [False, True])
def test_a_plain_answer_is_its_own_kind_and_never_a_bare_value(tune_n_max: bool) -> None:
    rec = answer(
        ReasonCode.PLAIN_AHEAD, ReasonCode.SETTLED, drafting_pays=False, tune_n_max=tune_n_max
    )
    assert rec.kind == PLAIN
    for fmt in (OutputFormat.ENV, OutputFormat.SHELL, OutputFormat.SYSTEMD):
        lines = rec.render(fmt).splitlines()
        # comments only, the draft length's line too: no setting applied
        assert all(line.startswith("#") for line in lines), lines
        assert "--model-draft" in lines[0] and "cannot" in lines[0]
        assert f"{ENV_MAX_SLOTS}=2" in lines[1]  # the best threshold, should the draft stay
        assert ("LLAMA_ARG_SPEC_DRAFT_N_MAX=3" in "".join(lines[1:])) == tune_n_max
    assert rec.render(OutputFormat.ARGS) == ""  # nothing to add: the draft flags go
    data = json.loads(rec.render(OutputFormat.JSON))
    assert data["answer"] == PLAIN and data["drafting_pays"] is False
    assert rec.headline().startswith("plain: serve without the draft model")


def test_without_a_plain_server_drafting_pays_is_unknown_not_true() -> None:
    rec = answer(ReasonCode.PLAIN_UNMEASURED, ReasonCode.SETTLED)
    data = json.loads(rec.render(OutputFormat.JSON))
    assert data["drafting_pays"] is None and data["answer"] == THRESHOLD
    assert "whether to draft at all was not measured" in rec.headline()


def test_unresolved_answers_say_so_in_every_form_with_the_tie_rule() -> None:
    rec = answer(ReasonCode.UNRESOLVED, measure_next=[3, 4], tie=[])
    assert rec.status == "unresolved"
    env = rec.render(OutputFormat.ENV).splitlines()
    assert env[0].startswith("# unresolved: N=2 is the best estimate so far") and len(env) == 2
    assert "unresolved" in rec.render(OutputFormat.TEXT)
    # plain, its threshold unresolved: the plain line, then the line that says unresolved and
    # what to measure, then the threshold should the draft model stay, all comments
    plain = answer(ReasonCode.PLAIN_AHEAD, ReasonCode.UNRESOLVED, drafting_pays=False)
    env = plain.render(OutputFormat.ENV).splitlines()
    assert env[0].startswith("# plain: serve qwen-q4 without its draft model")
    assert env[1].startswith("# unresolved: N=2 is the best estimate so far")
    assert env[2] == f"# should the draft model stay (unresolved): {ENV_MAX_SLOTS}=2"
    tied = answer(ReasonCode.SETTLED, tie=[2, 3])
    assert tied.headline() == "N=2 (settled live; tie [2, 3], the smallest chosen)"


@pytest.mark.parametrize(
    ("origin", "command"),
    [
        (None, "tuner tune --model qwen-q4"),
        (
            Origin("qwen-q4", "http://127.0.0.1:8080"),
            "tuner tune --url http://127.0.0.1:8080 --model qwen-q4",
        ),
        (
            Origin("qwen-q4", "http://127.0.0.1:8080", "http://127.0.0.1:8081"),
            "tuner tune --url http://127.0.0.1:8080 --plain-url http://127.0.0.1:8081 "
            "--model qwen-q4",
        ),
    ],
    ids=["spec", "running", "running-and-plain"],
)
def test_the_command_an_answer_suggests_fits_how_its_data_were_made(
    origin: Origin | None, command: str
) -> None:
    rec = answer(ReasonCode.UNRESOLVED, measure_next=[3], origin=origin)
    said = rec.render(OutputFormat.ENV)
    assert suggestions(said) == [command]
    assert suggestion_problem(command) is None
    assert json.loads(rec.render(OutputFormat.JSON))["measure_command"] == command


def test_a_comparison_without_data_is_said_in_words() -> None:
    missing = Contrast.of({}, {3: 1.0, 4: 1.0})
    cells = tables.contrast_cells(
        missing.estimate, missing.bounds(), missing.df, [3, 4], {3: 0, 4: 2}
    )
    assert cells == ["not measured at 3 streams", "", ""]
    assert missing.figures() == "not measured yet"
    assert not nonfinite_lines("\n".join([*cells, missing.figures()]))


def test_the_suite_catches_nan_and_commands_that_do_not_parse() -> None:
    """The output rules the suite applies everywhere can fail."""
    assert nonfinite_lines("| N=2 vs N=4 | 3,4 | +nan | [+nan, +nan] | 0.0 |")
    assert nonfinite_lines('{"advantage": NaN}') and nonfinite_lines("bound -inf")
    assert not nonfinite_lines("info: inference on nano models, infinite patience")
    assert suggestion_problem("tuner profile SPEC --resume") is None
    assert suggestion_problem("tuner tune --url URL --resume") is None  # parses; refused later
    assert "No such option" in str(suggestion_problem("tuner tune --url URL --levels 3"))
    assert suggestion_problem("tuner frobnicate") == "no such command: frobnicate"
