"""The README's own-server section, run as written against the bench: start the drafting server
(step 2), check it (3), tune it, start a second server without the draft model and tune again
with --plain-url (4), recommend in every format, report and watch --apply live (5). Each command
is the README's own ```sh line with only these substituted:

- paths: llama-server, model.gguf and draft.gguf by the bench's (`tuner bench where`), the env
  file and the report folder by the test's own, `tuner` by this interpreter's;
- ports: 8080 and 8081 by free ones;
- NAME: the name `check`'s model line says the data go under;
- durations: tune's budgets, round lengths and repeats, and watch's intervals, shortened
  (DURATIONS); nothing that changes what a command does.

What is checked: every command's exit status; the threshold given back after each tune; and
one answer on every surface (recommend's text, env, json, args and systemd forms, the report's
title, watch's first lines). Which N comes out is not checked: the twin grades decisions. The
suggested commands the outputs hold parse (tests/outputcheck.py, for every output)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tunerproc import Finished, run_tuner, tuner_env

from tuner.bench import Bench
from tuner.measure.client import LlamaClient, model_stem
from tuner.measure.launcher import free_port

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
# What the test adds to a command of the README to make it short: budgets and round lengths.
DURATIONS = {
    "tune": [
        *("--budget", "15s", "--profile-budget", "0", "--wait", "20s", "--tie-budget", "0"),
        *("--plain-budget", "30s"),
        *("--set", "workload.max_tokens=32", "--set", "workload.min_repeats=1"),
        *("--set", "workload.max_repeats=1", "--set", "workload.warmup=0"),
        *("--set", "probes.enabled=false"),
    ],
    "watch": ["--duration", "12s", "--every", "6s", "--window", "6s"],
}


def readme_commands() -> list[str]:
    """The shell lines of steps 2 to 5 of the README's own-server section, in order, with
    continuation lines joined and comments dropped."""
    text = README.read_text()
    section = text.split("### 2. Start it so that the tuner can switch it", 1)[1]
    section = section.split("### When the tuner may start the server itself", 1)[0]
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(" ".join(line.split()))
    return lines


def substituted(line: str, bench: Bench, ports: dict[str, str], tmp: Path, name: str) -> list[str]:
    """One README line as argv, with the substitutions of the module docstring."""
    words = shlex.split(line.rstrip("&").strip())
    paths = {
        "llama-server": str(bench.server),
        "model.gguf": str(bench.target),
        "draft.gguf": str(bench.draft),
        "/etc/llama/server.env": str(tmp / "server.env"),
        "report/": str(tmp / "report"),
        "NAME": name,
    }
    out = []
    for word in words:
        word = paths.get(word, word)
        for port, free in ports.items():
            word = word.replace(f":{port}", f":{free}") if word.startswith("http") else word
            word = free if word == port else word
        out.append(word)
    if out[0] == "tuner":
        out = [sys.executable, "-m", "tuner", *out[1:], *DURATIONS.get(out[1], [])]
    return out


def wait_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert server.poll() is None, log.read_text()[-2000:]
        time.sleep(0.5)
    raise AssertionError(f"{url} did not come up: {log.read_text()[-2000:]}")


def threshold(url: str) -> int | None:
    with LlamaClient(url) as api:
        return api.max_slots()


def test_the_readme_own_server_section_runs_as_written(bench: Bench, tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0].startswith("llama-server") and "--spec-type draft-simple" in commands[0]
    ports = {"8080": str(free_port()), "8081": str(free_port())}
    env = tuner_env(tmp_path / "tuner.db", tmp_path / "cache", TUNER_STATE_DIR=str(tmp_path))
    name = model_stem(str(bench.target))
    servers: list[subprocess.Popen] = []
    said: dict[str, Finished] = {}
    try:
        for i, line in enumerate(commands):
            argv = substituted(line, bench, ports, tmp_path, name)
            if line.startswith("llama-server"):
                log = tmp_path / f"server-{i}.log"
                with log.open("w") as out:
                    servers.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
                port = argv[argv.index("--port") + 1]
                wait_healthy(f"http://127.0.0.1:{port}", servers[-1], log)
                continue
            if ">>" in argv:  # recommend >> the env file, as a shell appends
                target = Path(argv[argv.index(">>") + 1])
                argv = argv[: argv.index(">>")]
                result = run_tuner(argv[3:], env, timeout_s=600)
                with target.open("a") as f:
                    f.write(result.stdout)
            else:
                result = run_tuner(argv[3:], env, timeout_s=600)
            assert result.returncode == 0, f"{line}:\n{result.stdout}\n{result.stderr[-3000:]}"
            said[line] = result
            if line.startswith("tuner check"):
                seen = re.search(r"model\s+(\S+) \(the name its data go under", result.stdout)
                assert seen and seen.group(1) == name, result.stdout
            if line.startswith("tuner tune"):
                # the threshold the server was started with, given back
                assert threshold(f"http://127.0.0.1:{ports['8080']}") == 0
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(30)
    one_answer(said, tmp_path, name)


def one_answer(said: dict[str, Finished], tmp: Path, name: str) -> None:
    """Every surface states the same answer and status."""
    out = {line.split("--format ")[1].split()[0] if "--format" in line else line: r.stdout
           for line, r in said.items() if line.startswith("tuner recommend")}  # fmt: skip
    text = out["text"].strip()
    data = json.loads(out["json"])
    assert data["headline"] == text
    assert data["answer"] in ("threshold", "plain")
    assert f"({data['status']}" in text or data["status"] == "settled" or "unresolved" in text
    env_file = (tmp / "server.env").read_text()
    if data["answer"] == "plain":
        assert out["args"].strip() == ""
        assert all(line.startswith("#") for line in env_file.splitlines() if line)
    else:
        assert out["args"].split() == ["--spec-draft-max-slots", str(data["max_slots"])]
        assert f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={data['max_slots']}" in env_file
        assert f"LLAMA_ARG_SPEC_DRAFT_MAX_SLOTS={data['max_slots']}" in out["systemd"]
    if data["status"] == "unresolved":
        assert env_file.lstrip().startswith("# unresolved")
    summary = (tmp / "report" / "summary.md").read_text()
    assert f"## Recommendation: {text}" in summary
    assert data["drafting_pays"] is not None, "the second tune measured plain beside it"
    (watch,) = [r for line, r in said.items() if line.startswith("tuner watch")]
    if data["answer"] == "threshold":
        assert f"N={data['max_slots']}" in watch.stderr
