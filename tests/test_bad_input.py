"""Bad input gets one clear error line that names the field, and a non-zero exit.

Run through the real command line (Typer's runner, in process). Nothing here starts a server:
every problem is caught before one would be launched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

SPEC = """
name = "bad-input"
model_name = "bad-input-model"

[server]
binary = "{binary}"
model = "{model}"
n_parallel = 4

[speculative]
args = ["--spec-type", "draft-simple"]

[workload]
concurrency = [1, 2]
max_tokens = 32
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    not_gguf = tmp_path / "model.txt"
    not_gguf.write_text("this is not a model\n")
    return {"binary": binary, "model": model, "not_gguf": not_gguf, "dir": tmp_path}


def spec_file(files: dict[str, Path], text: str | None = None, **replace: str) -> Path:
    body = (text or SPEC).format(binary=files["binary"], model=files["model"])
    for old, new in replace.items():
        assert old in body, old
        body = body.replace(old, new)
    path = files["dir"] / "spec.toml"
    path.write_text(body)
    return path


def fails_with_one_line(args: list[str], *fragments: str, exit_code: int = 2) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == exit_code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    # One error line (a progress bar that had started may stand before it).
    lines = [line for line in result.stderr.splitlines() if line.strip() and "━" not in line]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# --- profile specs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "fragments"),
    [
        ("n_parallel = 4", 'n_parallel = "four"', ["server.n_parallel:", "valid integer"]),
        ("max_tokens = 32", "max_tokens = 12.5", ["workload.max_tokens:", "integer"]),
        ("concurrency = [1, 2]", 'concurrency = "1,2"', ["workload.concurrency:", "valid list"]),
        ('args = ["--spec-type', 'args = "--spec-type', ["speculative.args:"]),
    ],
    ids=["string-for-int", "float-for-int", "string-for-list", "string-for-args"],
)
def test_wrong_types_name_the_field(
    files: dict[str, Path], old: str, new: str, fragments: list[str]
) -> None:
    path = spec_file(files)
    body = path.read_text()
    if new.startswith('args = "'):
        new_body = body.replace('args = ["--spec-type", "draft-simple"]', 'args = "--spec-type"')
    else:
        new_body = body.replace(old, new)
    path.write_text(new_body)
    line = fails_with_one_line(["profile", str(path)], f"error: {path}:", *fragments)
    assert line.count(":") >= 3


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--levels", "0"], ["workload.concurrency:", "at least 1"]),
        (["--levels=-2,4"], ["workload.concurrency:", "at least 1"]),
        (["--set", "workload.concurrency=[0, 1]"], ["workload.concurrency:", "at least 1"]),
        (["--set", "workload.concurrency=[]"], ["workload.concurrency:", "at least one level"]),
        (["--set", "server.n_parallel=0"], ["server.n_parallel:", "greater than or equal to 1"]),
        (["--set", "server.n_parallel=-3"], ["server.n_parallel:", "greater than or equal to 1"]),
    ],
    ids=["zero-level", "negative-level", "zero-in-spec", "no-levels", "zero-np", "negative-np"],
)
def test_zero_or_negative_concurrency(
    files: dict[str, Path], args: list[str], fragments: list[str]
) -> None:
    fails_with_one_line(["profile", str(spec_file(files)), *args], *fragments)


def test_levels_that_are_not_numbers_name_the_option(files: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["profile", str(spec_file(files)), "--levels", "1,two"])
    assert result.exit_code == 2
    assert "--levels" in result.stderr and "comma-separated integers" in result.stderr


@pytest.mark.parametrize("budget", ["ten", "-5m", "5x"])
def test_a_budget_that_is_not_a_duration_names_the_option(
    files: dict[str, Path], budget: str
) -> None:
    result = CliRunner().invoke(app, ["profile", str(spec_file(files)), "--budget", budget])
    assert result.exit_code == 2
    assert "--budget" in result.stderr


def test_durations_in_seconds_minutes_and_hours() -> None:
    from tuner.cli.options import duration_option

    assert [duration_option(t, "--budget") for t in ("0", "90", "90s", "10m", "1.5h")] == [
        0.0,
        90.0,
        90.0,
        600.0,
        5400.0,
    ]


def test_np_smaller_than_a_level(files: dict[str, Path]) -> None:
    line = fails_with_one_line(
        ["profile", str(spec_file(files)), "--set", "server.n_parallel=2", "--levels", "1,4"],
        "workload.concurrency: level 4 exceeds server.n_parallel (2)",
    )
    assert "(top level)" not in line
    fails_with_one_line(
        ["profile", str(spec_file(files)), "--set", "speculative.threshold=8"],
        "speculative.threshold: 8 exceeds server.n_parallel (4)",
    )


@pytest.mark.parametrize(
    ("how", "field"),
    [
        (["--set", "workload.max_token=32"], "workload.max_token"),
        (["--set", "server.nparallel=4"], "server.nparallel"),
        (["--set", "modelname=x"], "modelname"),
        ("[workload]\nrepeats = 2", "workload.repeats"),
        ("[servr]\nn_parallel = 2", "servr"),
    ],
    ids=["set-workload", "set-server", "set-top", "file-workload", "file-table"],
)
def test_unknown_keys_are_errors(files: dict[str, Path], how: list[str] | str, field: str) -> None:
    if isinstance(how, str):
        table, key = how.split("\n")
        path = spec_file(files, **{f"{table}\n": f"{table}\n{key}\n"} if table in SPEC else {})
        if table not in SPEC:
            path.write_text(path.read_text() + f"\n{how}\n")
        args = ["profile", str(path)]
    else:
        args = ["profile", str(spec_file(files)), *how]
    fails_with_one_line(args, f"{field}: unknown key (typo?)")


@pytest.mark.parametrize(
    ("field", "value"),
    [("server.binary", "/nonexistent/llama-server"), ("server.model", "/nonexistent/m.gguf")],
)
def test_paths_that_do_not_exist(files: dict[str, Path], field: str, value: str) -> None:
    fails_with_one_line(
        ["profile", str(spec_file(files)), "--set", f'{field}="{value}"'],
        f"{field}: file not found: {value}",
    )


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        (None, None, "prompt file not found"),
        ("empty.jsonl", b"", "the prompt file is empty"),
        ("latin1.txt", "caf\xe9\n".encode("latin-1"), "not UTF-8"),
        ("bad.jsonl", b'{"prompt": "ok"}\n{oops}\n', "line 2: not JSON"),
        ("blank.jsonl", b'{"prompt": ""}\n', "no usable prompt"),
    ],
    ids=["missing", "empty", "not-utf8", "bad-json-line", "no-usable-prompt"],
)
def test_a_bad_prompts_file_stores_nothing(
    files: dict[str, Path], tmp_path: Path, name: str | None, content: bytes | None, fragment: str
) -> None:
    prompts = files["dir"] / (name or "missing.jsonl")
    if content is not None:
        prompts.write_bytes(content)
    fails_with_one_line(
        ["profile", str(spec_file(files)), "--set", f'workload.prompts="{prompts}"'],
        "workload.prompts: ",
        str(prompts),
        fragment,
    )
    assert not (tmp_path / "tuner.db").exists()  # nothing stored, not even an empty database


def test_output_lengths_from_the_file_need_a_prompts_file(files: dict[str, Path]) -> None:
    fails_with_one_line(
        ["profile", str(spec_file(files)), "--set", 'workload.output.distribution="file"'],
        "workload",
        "needs a prompts file",
    )


def test_spec_file_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    fails_with_one_line(["profile", str(missing)], f"spec file not found: {missing}")


def test_a_model_file_that_is_not_gguf(files: dict[str, Path]) -> None:
    fails_with_one_line(
        ["profile", str(spec_file(files)), "--set", f'server.model="{files["not_gguf"]}"'],
        "server.model:",
        "is not a GGUF file",
    )


def test_spec_that_is_not_toml(files: dict[str, Path]) -> None:
    path = files["dir"] / "broken.toml"
    path.write_text("name = \n")
    fails_with_one_line(["profile", str(path)], f"{path}: not valid TOML")


# --- attach mode -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1:8080", "127.0.0.1:8080", "file:///tmp/x", "localhost"]
)
def test_a_url_that_is_not_http(url: str) -> None:
    fails_with_one_line(
        ["profile", "--url", url, "--label", "x"],
        f"--url {url!r}: must be an http:// or https:// URL",
    )


def test_attach_needs_a_label() -> None:
    fails_with_one_line(["profile", "--url", "http://127.0.0.1:9"], "--url needs --label")


def test_attach_to_nothing_says_so() -> None:
    line = fails_with_one_line(
        ["profile", "--url", "http://127.0.0.1:9", "--label", "x"], "cannot reach"
    )
    assert "http://127.0.0.1:9" in line


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        (["--switch", "live"], "--switch"),
        (["--resume"], "--resume"),
        (["--budget", "5m"], "--budget"),
        (["--skip-preflight"], "--skip-preflight"),
    ],
)
def test_attach_refuses_what_it_would_ignore(given: list[str], flag: str) -> None:
    """Attach mode measures the server once, as it is: an option of the launched profile is an
    error naming it, not accepted and ignored (the server at port 9 is never reached)."""
    fails_with_one_line(
        ["profile", "--url", "http://127.0.0.1:9", "--label", "x", *given],
        f"{flag} does not apply here",
        "attach mode",
    )


def test_a_spec_profile_refuses_attach_options(files: dict[str, Path]) -> None:
    fails_with_one_line(
        ["profile", str(spec_file(files)), "--label", "x"], "--label does not apply here"
    )


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        (["--window", "30s"], "--window"),
        (["--traffic", "seen"], "--traffic"),
        (["--arrivals", "poisson", "--rate", "1", "--resume"], "--resume"),
    ],
)
def test_validate_refuses_options_of_the_other_mode(given: list[str], flag: str) -> None:
    fails_with_one_line(["validate", "--model", "m", *given], f"{flag} does not apply here")


# --- the database URL ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("foo://user@host/db", ["database URL (--db / TUNER_DB)", "unknown dialect 'foo'"]),
        ("mysqlx+nodriver://h/db", ["database URL (--db / TUNER_DB)", "unknown dialect"]),
        ("://nowhere", ["database URL (--db / TUNER_DB)", "not a valid SQLAlchemy URL"]),
    ],
    ids=["unknown-dialect", "unknown-driver", "not-a-url"],
)
def test_database_url_of_an_unknown_dialect(
    url: str, fragments: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fails_with_one_line(["--db", url, "runs"], *fragments)
    monkeypatch.setenv("TUNER_DB", url)
    fails_with_one_line(["runs"], *fragments)


def test_a_plain_file_path_names_an_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tuner.db"
    result = CliRunner().invoke(app, ["--db", str(path), "runs"])
    assert result.exit_code == 0, result.output
    assert path.is_file()


def test_a_database_path_in_a_folder_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    fails_with_one_line(
        ["--db", str(tmp_path / "file" / "tuner.db"), "runs"], "cannot make the folder"
    )
    assert not list(tmp_path.glob("file/*"))


def test_database_that_cannot_be_reached() -> None:
    url = "postgresql+psycopg://tuner@127.0.0.1:9/nowhere"
    fails_with_one_line(["--db", url, "runs"], f"cannot open database {url}")


def test_a_password_in_the_database_url_is_never_printed() -> None:
    result = CliRunner().invoke(
        app, ["--db", "postgresql+psycopg://tuner:hunter2@127.0.0.1:9/nowhere", "runs"]
    )
    assert result.exit_code == 2
    assert "hunter2" not in result.output
    assert "***" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"), [("TUNER_DB_BUSY_TIMEOUT_S", "soon"), ("TUNER_DB_BUSY_TIMEOUT_S", "-1")]
)
def test_bad_settings_name_their_variable(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    fails_with_one_line(["runs"], f"error: {variable}:")
