"""`tuner check --url` (tuner.measure.doctor, tuner/cli/check.py) against twin servers served as
llama-server is started (tuner.twin.server in a thread of this process, its llama-server command
line, noise off, 50 times faster than the wall): healthy, without the tuner's patch
(--twin-unpatched: the stock build of the same source), without --props, without --metrics,
with a wrong API key, with one slot and with two, and without a draft model. A fake HTTP server
stands in only for what no llama-server answers: a web page, another OpenAI-compatible server,
/props without total_slots, a switch that reads back another value; and a port nobody listens
on. Also the twin's unpatched mode itself, the live switch check ServerBackend shares with
check, and a SQLite database whose folder cannot be made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fakellama import Fake, fake_server
from tunerproc import TWIN_BENCH_WORLD, TWIN_SPEC, run_tuner, tuner_env, twin_server_script
from twinworlds import SEED_WORLD
from typer.testing import CliRunner, Result

from tuner.cli import app
from tuner.measure import doctor
from tuner.measure.backend import ServerBackend
from tuner.measure.client import MAX_SLOTS_FIELD, LlamaClient
from tuner.measure.doctor import ONE_SLOT, PATCH, Status, check
from tuner.measure.spec import load_spec
from tuner.policy import Policy
from tuner.twin.cmdline import ArgError, launch_world, parse_args
from tuner.twin.command import main as twin_command
from tuner.twin.server import TwinServer

DRAFTING = ["--model-draft", "draft.gguf", "--spec-type", "draft-simple"]


@contextmanager
def twin(*flags: str, parallel: int = 4) -> Iterator[TwinServer]:
    """A twin of the seed world (n_max 3) started with llama-server's flags, on a free port."""
    argv = ["--model", str(SEED_WORLD), "--port", "0", "--parallel", str(parallel)]
    argv += ["--noise", "off", "--speed", "50", "--seed", "1", *flags]
    args = parse_args(argv, env={})
    world, policy = launch_world(args)
    server = TwinServer(args, world, policy, log=lambda _: None).start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


def tuner_check(url: str, *extra: str) -> Result:
    result = CliRunner().invoke(app, ["check", "--url", url, *extra])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def lines(result: Result, status: str) -> list[str]:
    """The screen's lines of one status (ok, info, warn, skip, fail)."""
    return [line for line in result.stdout.splitlines() if line.startswith(f"{status} ")]


def one_failure(result: Result, *names: str) -> str:
    """Exit 1 and exactly one failing line, naming every one of names."""
    assert result.exit_code == 1, result.stdout
    failed = lines(result, "fail")
    assert len(failed) == 1, result.stdout
    for name in names:
        assert name in failed[0], failed[0]
    assert "tune --url cannot run here yet" in result.stdout
    return failed[0]


def threshold(url: str, api_key: str | None = None) -> int | None:
    with LlamaClient(url, api_key) as api:
        return api.max_slots()


# --- twin servers -----------------------------------------------------------------------------


def test_a_healthy_patched_server_passes_and_keeps_its_threshold() -> None:
    with twin(*DRAFTING, "--props", "--metrics", "--spec-draft-max-slots", "3") as server:
        before = httpx.get(f"{server.url}/metrics").text
        result = tuner_check(server.url)
        assert threshold(server.url) == 3  # what it found, set back
        after = httpx.get(f"{server.url}/metrics").text
    assert result.exit_code == 0, result.stdout
    assert not lines(result, "fail") and not lines(result, "warn"), result.stdout
    assert "tune --url can run against this server" in result.stdout
    (switch,) = [line for line in lines(result, "ok") if " live switch " in line]
    assert "the draft counters follow it" in switch and switch.endswith("set back to 3")
    (kind,) = [line for line in lines(result, "ok") if " speculative " in line]
    assert "type draft-simple, n_max 3" in kind
    assert "spec_draft_max_slots = 3" in result.stdout
    assert "4 slots: N from 0 (always draft) to 3" in result.stdout
    # The check's rounds drafted: the counters moved (the engine's, through /metrics).
    assert _drafts(after) > _drafts(before)


def _drafts(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith("llamacpp:spec_decode_num_draft_tokens_total "):
            return float(line.split()[1])
    raise AssertionError("no draft token counter")


def test_a_server_without_the_patch_is_one_line_naming_it() -> None:
    with twin(*DRAFTING, "--props", "--metrics", "--twin-unpatched") as server:
        result = tuner_check(server.url)
        assert threshold(server.url) is None
    line = one_failure(result, "--spec-draft-max-slots", PATCH)
    assert "does not know --spec-draft-max-slots" in line
    assert any(" live switch " in s for s in lines(result, "skip"))


@pytest.mark.parametrize(
    ("flags", "flag"),
    [(("--metrics",), "--props"), (("--props",), "--metrics")],
    ids=["no-props", "no-metrics"],
)
def test_an_endpoint_switched_off_is_one_line_naming_its_flag(
    flags: tuple[str, ...], flag: str
) -> None:
    with twin(*DRAFTING, "--spec-draft-max-slots", "2", *flags) as server:
        result = tuner_check(server.url)
        assert threshold(server.url) == 2
    line = one_failure(result, f"fix: {flag}")
    assert line.split()[1] == flag


def test_a_wrong_or_missing_api_key_is_one_line_naming_it() -> None:
    with twin(*DRAFTING, "--props", "--metrics", "--api-key", "sesame") as server:
        wrong = tuner_check(server.url, "--api-key", "nope")
        missing = tuner_check(server.url)
        right = tuner_check(server.url, "--api-key", "sesame")
    one_failure(wrong, "API key", "rejected the API key", "--api-key")
    one_failure(missing, "API key", "wants an API key", "--api-key")
    assert right.exit_code == 0, right.stdout
    assert any(" API key " in line and "accepted" in line for line in lines(right, "ok"))


def test_one_slot_passes_and_says_the_threshold_changes_nothing() -> None:
    with twin(*DRAFTING, "--props", "--metrics", parallel=1) as server:
        report = check(server.url)
        assert threshold(server.url) == 0
        result = tuner_check(server.url)
    assert report.can_tune, report.findings
    np = report.finding("-np")
    assert np is not None and np.seen == ONE_SLOT
    switch = report.finding("live switch")
    assert switch is not None and switch.status is Status.OK
    assert "read it back" in switch.seen and "one slot" in switch.seen
    assert result.exit_code == 0 and "1 slot: no threshold changes anything" in result.stdout


def test_two_slots_pass_with_n_zero_one_or_plain() -> None:
    with twin(*DRAFTING, "--props", "--metrics", "--spec-draft-max-slots", "1", parallel=2) as s:
        result = tuner_check(s.url)
        assert threshold(s.url) == 1
    assert result.exit_code == 0, result.stdout
    assert "2 slots: N is 0 (always draft), 1 (draft only while one stream generates) or plain" in (
        result.stdout
    )
    assert any(" live switch " in line for line in lines(result, "ok"))


def test_a_server_without_a_draft_model_names_the_flag() -> None:
    with twin("--props", "--metrics") as server:
        result = tuner_check(server.url)
    one_failure(result, "speculative", "--model-draft")


# --- what no llama-server answers ---------------------------------------------------------------

PROPS = {
    "total_slots": 4,
    "model_path": "/m/x.gguf",
    "endpoint_props": True,
    "endpoint_metrics": True,
    "endpoint_slots": True,
    MAX_SLOTS_FIELD: 7,
}
METRICS = "# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
METRICS += "llamacpp:spec_decode_num_drafts_total 0\n"


@pytest.fixture
def fake() -> Iterator[Fake]:
    with fake_server() as state:
        yield state


def server_line(result: Result) -> str:
    """Exit 1 with the one line that says why nothing else was checked."""
    line = one_failure(result, "server", "is not a llama-server")
    assert len(result.stdout.splitlines()) == 3, result.stdout  # title, the line, the verdict
    return line


def test_a_web_page(fake: Fake) -> None:
    fake.get["/props"] = (200, "<!doctype html><html><body>hi</body></html>", "text/html")
    assert "with a web page (HTML)" in server_line(tuner_check(fake.url))


def test_another_openai_compatible_server(fake: Fake) -> None:
    fake.get["/v1/models"] = (200, json.dumps({"object": "list", "data": [{"id": "qwen3-8b"}]}))
    line = server_line(tuner_check(fake.url))
    assert "answered HTTP 404" in line
    assert "GET /v1/models lists qwen3-8b: an OpenAI-compatible server, but not llama-server" in (
        line
    )


def test_props_without_total_slots(fake: Fake) -> None:
    fake.get["/props"] = (200, json.dumps({"model_path": "/m/x.gguf"}))
    assert "answered HTTP 200 without total_slots" in server_line(tuner_check(fake.url))


def test_a_switch_that_reads_back_another_value_is_set_back(fake: Fake) -> None:
    fake.get["/props"] = (200, json.dumps(PROPS))
    fake.get["/metrics"] = (200, METRICS, "text/plain")
    fake.get["/slots"] = (200, json.dumps([{"id": 0, "speculative": True}]))
    fake.post["/props"] = lambda body: (200, json.dumps({"success": True, **body}))
    line = one_failure(tuner_check(fake.url), "live switch")
    assert f"accepted {MAX_SLOTS_FIELD}=1 on POST /props but GET /props then reported " in line
    assert f"{MAX_SLOTS_FIELD}=7" in line
    posted = [body for path, body in fake.bodies if path == "/props"]
    assert posted == [{MAX_SLOTS_FIELD: 1}, {MAX_SLOTS_FIELD: 7}]  # tried, then set back


def test_a_threshold_that_cannot_be_set_back_is_said(fake: Fake) -> None:
    """The switch takes 1 and reads it back, the check's rounds fail (the fake serves no
    requests), and setting 7 back is refused: both lines, the second with the request that
    restores it."""
    fake.get["/metrics"] = (200, METRICS, "text/plain")
    fake.get["/slots"] = (200, json.dumps([{"id": 0, "speculative": True}]))

    def post(body: dict[str, object]) -> tuple[int, str]:
        if body[MAX_SLOTS_FIELD] == 7:
            return 500, json.dumps({"error": {"message": "busy"}})
        fake.get["/props"] = (200, json.dumps({**PROPS, **body}))
        return 200, json.dumps({"success": True, **body})

    fake.get["/props"] = (200, json.dumps(PROPS))
    fake.post["/props"] = post
    report = check(fake.url)
    failed = {f.name: f for f in report.findings if f.status is Status.FAIL}
    assert sorted(failed) == ["live switch", "threshold"], report.findings
    assert "POST /tokenize" in failed["live switch"].seen
    assert failed["threshold"].seen.startswith(f"could not set {MAX_SLOTS_FIELD} back to 7: ")
    assert failed["threshold"].fix.startswith(f'POST /props {{"{MAX_SLOTS_FIELD}": 7}}')


def test_an_interrupted_check_sets_the_threshold_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(url: str, *args: object, **kwargs: object) -> None:
        with LlamaClient(url) as api:
            api.set_max_slots(0)
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "check_live_switch", interrupted)
    with twin(*DRAFTING, "--props", "--metrics", "--spec-draft-max-slots", "2") as server:
        with pytest.raises(KeyboardInterrupt):
            check(server.url)
        assert threshold(server.url) == 2


def test_a_url_that_does_not_answer() -> None:
    result = tuner_check("http://127.0.0.1:9")
    line = one_failure(result, "server", "cannot reach http://127.0.0.1:9")
    assert "start llama-server there" in line
    bad = CliRunner().invoke(app, ["check", "--url", "127.0.0.1:9"])
    assert bad.exit_code == 2 and "must be an http:// or https:// URL" in bad.stderr


# --- the twin as a stock llama-server ---------------------------------------------------------


def test_the_unpatched_twin_answers_as_the_stock_build(capsys: pytest.CaptureFixture) -> None:
    stock = ["--model", str(SEED_WORLD), *DRAFTING, "--twin-unpatched"]
    with pytest.raises(ArgError, match=r"^error: invalid argument: --spec-draft-max-slots$"):
        parse_args([*stock, "--spec-draft-max-slots", "2"], env={})
    # The stock build never reads the patch's variable: it drafts at every concurrency.
    args = parse_args(stock, env={"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS": "2"})
    assert launch_world(args)[1] == Policy.always(3)
    assert twin_command(["--help", "--twin-unpatched"]) == 0
    assert "--spec-draft-max-slots" not in capsys.readouterr().out
    assert twin_command(["--help"]) == 0
    assert "--spec-draft-max-slots" in capsys.readouterr().out
    with twin(*DRAFTING, "--props", "--twin-unpatched") as server:
        posted = httpx.post(f"{server.url}/props", json={MAX_SLOTS_FIELD: 1})
        props = httpx.get(f"{server.url}/props").json()
        assert server.live is not None and server.live.max_slots == 0  # nothing changed
    assert posted.status_code == 200 and posted.json() == {"success": True}
    assert MAX_SLOTS_FIELD not in props and props["endpoint_props"] is True


def test_props_say_none_for_the_type_and_slots_say_what_a_request_ran_with() -> None:
    """llama-server's GET /props carries a default request's params ("none" whatever the server
    drafts); a slot that served a request carries the server's speculative types."""
    with twin(*DRAFTING, "--props") as server:
        props = httpx.get(f"{server.url}/props").json()
        body = {"prompt": "hi", "n_predict": 4}
        assert httpx.post(f"{server.url}/completion", json=body).status_code == 200
        slots = httpx.get(f"{server.url}/slots").json()
    assert props["default_generation_settings"]["params"]["speculative.types"] == "none"
    served = [s for s in slots if "params" in s]
    assert served and served[0]["params"]["speculative.types"] == "none,draft-simple"
    assert all(s["speculative"] is True for s in slots)


# --- the switch check ServerBackend shares ----------------------------------------------------


@pytest.mark.parametrize("unpatched", [False, True], ids=["patched", "unpatched"])
def test_server_backend_checks_the_switch_as_before(tmp_path: Path, unpatched: bool) -> None:
    server_args = ["--kv-unified", "--speed", "50", "--noise", "off"]
    spec = load_spec(
        TWIN_SPEC,
        [
            ("server.binary", str(twin_server_script(tmp_path))),
            ("server.model", str(TWIN_BENCH_WORLD)),
            ("server.args", [*server_args, *(["--twin-unpatched"] if unpatched else [])]),
            ("workload.warmup", 0),
        ],
        check_files=False,
    )
    backend = ServerBackend(spec, tmp_path / "logs", switch="auto")
    try:
        way = backend.check_switch([Policy.always(), Policy.threshold(1)])
        if unpatched:
            assert way == "relaunch" and backend._up is None
            (note,) = backend.notes
            assert "does not support the live switch" in note and "no such field" in note
            assert note.endswith(": measuring by relaunching the server for every policy instead")
        else:
            assert way == "live" and not backend.notes
            assert backend._up is not None and backend._up.max_slots == 0  # left at 0, as known
            assert threshold(backend._up.server.url) == 0
    finally:
        backend.close()


# --- the database -----------------------------------------------------------------------------


def test_a_sqlite_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    finished = run_tuner(["runs"], tuner_env("sqlite:////proc/nope/x.db", tmp_path), 120)
    assert finished.returncode == 2, finished.stderr
    assert "Traceback" not in finished.stderr
    assert finished.stderr.strip().splitlines() == finished.error_lines
    (line,) = finished.error_lines
    assert "cannot make the folder /proc/nope of the SQLite database" in line
    assert "sqlite:////proc/nope/x.db" in line
    assert not Path("/proc/nope").exists()
