"""The README's own-server section as commands: its ```sh lines of steps 2 to 5, and each one as
argv with the paths, ports and names of a bench substituted. Shared by tests/test_readme_path.py
(which runs them, durations shortened) and benchmarks/readme_path.py (which times them as
written)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from tunerproc import Finished, run_tuner

from tuner.bench import Bench
from tuner.measure.client import LlamaClient

README = Path(__file__).resolve().parent.parent / "README.md"


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


def with_plain_url(lines: list[str]) -> list[str]:
    """The path of a user who starts the second server: step 4's `tune --plain-url` in place of
    the tune without it (the README: "instead of the line above")."""
    if not any(line.startswith("tuner tune") and "--plain-url" in line for line in lines):
        return lines
    return [
        line for line in lines if not (line.startswith("tuner tune") and "--plain-url" not in line)
    ]


def substituted(
    line: str,
    bench: Bench,
    ports: dict[str, str],
    tmp: Path,
    name: str,
    extra: dict[str, list[str]] | None = None,
) -> list[str]:
    """One README line as argv: llama-server, model.gguf and draft.gguf by the bench's, the env
    file and report folder by tmp's, NAME by name, ports by ports' values, `tuner` by this
    interpreter's; extra: arguments added to a tuner command by its name (durations)."""
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
        out = [sys.executable, "-m", "tuner", *out[1:], *(extra or {}).get(out[1], [])]
    return out


@dataclass
class Step:
    """One README line as it ran: when, for how long, what it printed."""

    line: str
    started_s: float  # from the walk's start
    seconds: float
    result: Finished | None = None  # None: a server started in the background


def wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise AssertionError(f"{url} exited: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{url} did not come up: {log.read_text()[-2000:]}")


def threshold(url: str) -> int | None:
    with LlamaClient(url) as api:
        return api.max_slots()


def walk(
    bench: Bench,
    tmp: Path,
    env: dict[str, str],
    ports: dict[str, str],
    name: str,
    extra: dict[str, list[str]] | None = None,
    after: Callable[[Step], None] | None = None,
    lines: list[str] | None = None,
) -> list[Step]:
    """Run the README's own-server lines in order (servers in the background, stopped at the
    end; `>> FILE` appended as a shell would); after(step) runs after each command (a test's
    checks). lines: those to run (default every one). A command that fails raises
    AssertionError with its output."""
    servers: list[subprocess.Popen] = []
    steps: list[Step] = []
    began = time.monotonic()
    try:
        for i, line in enumerate(readme_commands() if lines is None else lines):
            argv = substituted(line, bench, ports, tmp, name, extra)
            started = time.monotonic()
            if line.startswith("llama-server"):
                log = tmp / f"server-{i}.log"
                with log.open("w") as out:
                    servers.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
                port = argv[argv.index("--port") + 1]
                wait_healthy(f"http://127.0.0.1:{port}", servers[-1], log)
                steps.append(Step(line, started - began, time.monotonic() - started))
                continue
            target = Path(argv[argv.index(">>") + 1]) if ">>" in argv else None
            args = argv[3 : argv.index(">>")] if target else argv[3:]
            result = run_tuner(args, env, timeout_s=1800)
            if target is not None:
                with target.open("a") as f:
                    f.write(result.stdout)
            if result.returncode != 0:
                raise AssertionError(f"{line}:\n{result.stdout}\n{result.stderr[-3000:]}")
            steps.append(Step(line, started - began, time.monotonic() - started, result))
            if after is not None:
                after(steps[-1])
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(30)
    return steps


def surfaces(steps: list[Step], tmp: Path) -> dict[str, str]:
    """What each surface says the answer is, in its own words, side by side."""
    out: dict[str, str] = {}
    for step in steps:
        if step.result is None or not step.line.startswith("tuner "):
            continue
        if step.line.startswith("tuner recommend") and ">>" not in step.line:
            form = step.line.split("--format ")[1].split()[0] if "--format" in step.line else "env"
            out[f"recommend --format {form}"] = step.result.stdout.strip()
        elif step.line.startswith("tuner tune"):
            said = [x for x in step.result.stdout.splitlines() if x.startswith("answer: ")]
            key = "tune --plain-url" if "--plain-url" in step.line else "tune"
            out[key] = said[-1] if said else ""
        elif step.line.startswith("tuner watch"):
            logged = [x for x in step.result.stderr.splitlines() if "N=" in x]
            out["watch (first line with N)"] = logged[0].split(" ", 1)[-1] if logged else ""
    summary = tmp / "report" / "summary.md"
    if summary.exists():
        titles = [x for x in summary.read_text().splitlines() if x.startswith("## Recommendation")]
        out["report summary.md"] = titles[0].removeprefix("## Recommendation: ") if titles else ""
    env_file = tmp / "server.env"
    if env_file.exists():
        out["env file"] = env_file.read_text().strip()
    if "recommend --format json" in out:
        data = json.loads(out["recommend --format json"])
        out["recommend --format json"] = (
            f"answer {data['answer']}, status {data['status']}, max_slots {data['max_slots']}, "
            f"drafting_pays {data['drafting_pays']}"
        )
    return out
