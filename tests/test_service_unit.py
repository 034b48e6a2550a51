"""docs/service.md's systemd unit, as a user copies it, passes `systemd-analyze verify` (where
systemd is installed; the unit's ExecStart pointed at this tuner, the only path substituted)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from outputcheck import suggestion_problem

SERVICE = Path(__file__).resolve().parent.parent / "docs" / "service.md"


def test_the_service_page_systemd_unit_verifies(tmp_path: Path) -> None:
    """docs/service.md's unit, written out with its ExecStart pointing at this tuner."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    block = re.search(r"```ini\n(.*?)```", SERVICE.read_text(), re.S)
    assert block, "docs/service.md has no ```ini unit"
    tuner = str(Path(sys.executable).parent / "tuner")
    unit = block.group(1).replace("/opt/tuner/.venv/bin/tuner", tuner)
    path = tmp_path / "tuner-watch.service"
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "tuner-watch.service" in line and "llama-server.service" not in line
    ]
    assert not problems, "\n".join(problems)


def test_the_service_page_unit_runs_a_tuner_command_that_parses() -> None:
    block = re.search(r"```ini\n(.*?)```", SERVICE.read_text(), re.S)
    assert block
    execstart = block.group(1).replace("\\\n", " ").split("ExecStart=", 1)[1].splitlines()[0]
    command = "tuner " + execstart.split("/tuner ", 1)[1]
    assert suggestion_problem(command) is None, command
