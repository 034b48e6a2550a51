"""The server left as found (tuner.measure.hold): the threshold found given back on a return,
an error, Ctrl-C, SIGTERM, and after SIGKILL by the next run; one tune a server at a time; the
record on the disk before the first switch; a server that restarted mid-hold named.

The server is a twin in a thread of this process (its live switch is llama-server's); the
tuners that die are small scripts run by this interpreter, holding that server over HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from twinthread import twin_in_thread

from tuner.errors import ServerError
from tuner.measure.client import max_slots, set_max_slots
from tuner.measure.hold import (
    ServerHold,
    check_threshold,
    hold_paths,
    normalise_url,
    recover_left_hold,
)
from tuner.measure.launcher import free_port
from tuner.measure.plan import ProgressEvent
from tuner.twin.server import TwinServer

FOUND = 2  # the threshold the server was started with: what every way out must give back

HOLDER = """
import sys, time
from pathlib import Path
from tuner.cli.options import terminate_as_interrupt
from tuner.measure.hold import ServerHold

url, state, stage = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
with terminate_as_interrupt(), ServerHold(url, None, state) as hold:
    hold.before_switch()
    print("recorded", flush=True)
    if stage == "switch":
        hold.switch(5)
        print("switched", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def server() -> Iterator[TwinServer]:
    twin = twin_in_thread("--spec-draft-max-slots", str(FOUND))
    yield twin
    twin.stop_thread()


class Said:
    """An observer that keeps the messages."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: ProgressEvent) -> None:
        self.lines.append(event.text)


def _holder(tmp_path: Path, url: str, stage: str) -> subprocess.Popen[str]:
    """A tuner holding url in another process, once it printed that it recorded (and switched:
    stage "switch")."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    process = subprocess.Popen(
        [sys.executable, str(script), url, str(tmp_path / "state"), stage],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    wanted = "switched" if stage == "switch" else "recorded"
    for line in process.stdout:
        if line.strip() == wanted:
            return process
    raise AssertionError(f"the holder ended before {wanted!r}: {process.communicate()[1][-2000:]}")


def test_a_url_is_one_server_however_it_is_written(tmp_path: Path) -> None:
    same = ["http://localhost:8080", "http://127.0.0.1:8080/", "HTTP://LOCALHOST:8080"]
    same.append("[::1]:8080")
    assert {normalise_url(u) for u in same} == {"http://127.0.0.1:8080"}
    assert normalise_url("https://gpu-box/") == "https://gpu-box:443"
    assert hold_paths(same[0], tmp_path) == hold_paths(same[1], tmp_path)
    assert hold_paths(same[0], tmp_path) != hold_paths("http://127.0.0.1:8081", tmp_path)


def test_the_threshold_comes_back_on_a_return_and_the_record_goes(
    server: TwinServer, tmp_path: Path
) -> None:
    said = Said()
    with ServerHold(server.url, None, tmp_path, said) as hold:
        hold.switch(4)
        assert max_slots(server.url) == 4
        hold.check()  # still 4
        record = json.loads(hold.record_path.read_text())
        assert record["original"] == FOUND and record["holder"]["pid"] > 0
    assert max_slots(server.url) == FOUND
    assert not hold.record_path.exists()
    assert any(f"back to {FOUND}" in line for line in said.lines)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_threshold_comes_back_on_an_error_and_on_ctrl_c(
    server: TwinServer, tmp_path: Path, error: type[BaseException]
) -> None:
    with pytest.raises(error), ServerHold(server.url, None, tmp_path) as hold:
        hold.switch(1)
        raise error("stop")
    assert max_slots(server.url) == FOUND
    assert not hold.record_path.exists()


def test_a_hold_that_never_switched_leaves_the_server_alone(
    server: TwinServer, tmp_path: Path
) -> None:
    with ServerHold(server.url, None, tmp_path) as hold:
        set_max_slots(server.url, 3)  # the operator, not the tuner
    assert max_slots(server.url) == 3
    assert not hold.record_path.exists()


def test_a_second_tune_of_a_server_is_refused_while_the_first_runs(
    server: TwinServer, tmp_path: Path
) -> None:
    with (
        ServerHold(server.url, None, tmp_path),
        pytest.raises(ServerError, match=r"another tuner .*is tuning"),
    ):
        ServerHold(server.url.replace("127.0.0.1", "localhost"), None, tmp_path).__enter__()
    with ServerHold(server.url, None, tmp_path):  # free again once the first is done
        pass


def test_a_tuner_in_another_process_is_named_by_the_one_refused(
    server: TwinServer, tmp_path: Path
) -> None:
    process = _holder(tmp_path, server.url, "switch")
    try:
        with pytest.raises(ServerError) as refused:
            ServerHold(server.url, None, tmp_path / "state").__enter__()
        assert f"pid {process.pid}" in str(refused.value)
        assert len(str(refused.value).splitlines()) == 1
        # a command that only recovers leaves a live tuner's record alone
        assert recover_left_hold(server.url, None, tmp_path / "state") is None
        assert max_slots(server.url) == 5
    finally:
        process.kill()
        process.communicate()


def test_sigterm_gives_the_threshold_back(server: TwinServer, tmp_path: Path) -> None:
    process = _holder(tmp_path, server.url, "switch")
    assert max_slots(server.url) == 5
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert "KeyboardInterrupt" in stderr  # the CLI's way: SIGTERM as Ctrl-C
    assert max_slots(server.url) == FOUND
    assert not hold_paths(server.url, tmp_path / "state")[1].exists()


def test_after_sigkill_the_next_run_restores_and_says_so(
    server: TwinServer, tmp_path: Path
) -> None:
    process = _holder(tmp_path, server.url, "switch")
    process.kill()
    process.communicate()
    assert max_slots(server.url) == 5  # nothing gave it back
    said = Said()
    assert recover_left_hold(server.url, None, tmp_path / "state", said) == FOUND
    assert max_slots(server.url) == FOUND
    assert len(said.lines) == 1
    assert f"restored spec_draft_max_slots={FOUND}" in said.lines[0]
    assert f"pid {process.pid}" in said.lines[0]
    assert recover_left_hold(server.url, None, tmp_path / "state", said) is None  # done once
    assert len(said.lines) == 1


def test_the_record_is_on_the_disk_before_the_first_switch(
    server: TwinServer, tmp_path: Path
) -> None:
    """Killed between recording and switching: the switch may have gone out already, and the
    next tune still gives back the threshold found, not the one switched to."""
    process = _holder(tmp_path, server.url, "record")
    process.kill()
    process.communicate()
    set_max_slots(server.url, 6)  # the switch the killed tuner had sent
    said = Said()
    with ServerHold(server.url, None, tmp_path / "state", said) as hold:
        assert max_slots(server.url) == FOUND  # restored on entering
        assert hold.before_switch() == FOUND
        hold.switch(3)
    assert max_slots(server.url) == FOUND
    assert any("stopped without giving it back" in line for line in said.lines)


def test_an_unreachable_server_keeps_the_record_and_a_restart_is_named(tmp_path: Path) -> None:
    port = free_port()
    first = twin_in_thread("--spec-draft-max-slots", str(FOUND), port=port)
    said = Said()
    with ServerHold(first.url, None, tmp_path, said) as hold:
        try:
            hold.switch(4)
        finally:
            first.stop_thread()  # the server goes away mid-hold
    assert hold.record_path.exists()
    assert any("the next tuner run against this URL restores it" in line for line in said.lines)
    # It comes back on its command line's threshold, which is not what a tuner had set.
    again = twin_in_thread("--spec-draft-max-slots", "1", port=port)
    try:
        with pytest.raises(ServerError, match="restarted") as restarted:
            check_threshold(again.url, None, 4)
        assert len(str(restarted.value).splitlines()) == 1
        assert recover_left_hold(again.url, None, tmp_path, said) == FOUND
        assert max_slots(again.url) == FOUND
    finally:
        again.stop_thread()
