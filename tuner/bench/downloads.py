"""Release files from PyPI, verified by the sha256 PyPI publishes and cached for offline reuse."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from tuner.errors import BenchError
from tuner.measure.fingerprint import sha256_file

PYPI_SIMPLE = "https://pypi.org/simple"

Progress = Callable[[str], None]


def say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _pypi_file(package: str, filename: str) -> tuple[str, str]:
    """Return (url, sha256) of one file of a PyPI project via the JSON simple API."""
    try:
        response = httpx.get(
            f"{PYPI_SIMPLE}/{package}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
            timeout=60,
            follow_redirects=True,
        )
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot list {package} on PyPI: {exc}") from exc
    for entry in response.json().get("files", []):
        if entry["filename"] == filename:
            return entry["url"], entry["hashes"]["sha256"]
    raise BenchError(f"{filename} is not on PyPI's {package} page")


def download_pypi_file(
    package: str, filename: str, dest_dir: Path, progress: Progress | None
) -> Path:
    """Download one release file from PyPI into dest_dir, verified by its sha256; cached."""
    dest = dest_dir / filename
    known = dest.with_name(dest.name + ".sha256")
    # A file verified once is trusted offline while its bytes still match the recorded digest.
    if dest.exists() and known.exists() and sha256_file(dest) == known.read_text().strip():
        return dest
    url, expected = _pypi_file(package, filename)
    if dest.exists() and sha256_file(dest) == expected:
        known.write_text(expected)
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(dest.suffix + ".part")
    say(progress, f"downloading {filename}")
    try:
        with httpx.stream("GET", url, timeout=300, follow_redirects=True) as response:
            response.raise_for_status()
            with part.open("wb") as fh:
                for block in response.iter_bytes(1 << 20):
                    fh.write(block)
    except httpx.HTTPError as exc:
        part.unlink(missing_ok=True)
        raise BenchError(f"download of {filename} failed: {exc}") from exc
    actual = sha256_file(part)
    if actual != expected:
        part.unlink(missing_ok=True)
        raise BenchError(f"{filename}: sha256 {actual} does not match PyPI's {expected}")
    part.replace(dest)
    known.write_text(expected)
    return dest
