"""The README's own-server lines as the README test and benchmarks/readme_path.py read them."""

from __future__ import annotations

from readme import readme_commands, with_plain_url


def test_the_plain_url_path_runs_its_tune_in_place_of_the_other() -> None:
    lines = readme_commands()
    tunes = [line for line in lines if line.startswith("tuner tune")]
    assert len(tunes) == 2 and "--plain-url" in tunes[1] and "--plain-url" not in tunes[0]
    path = with_plain_url(lines)
    assert [line for line in path if line.startswith("tuner tune")] == [tunes[1]]
    assert [line for line in lines if line != tunes[0]] == path
    # the second server still starts before its tune, and watch still comes last
    assert path.index(tunes[1]) > next(i for i, s in enumerate(path) if "--port 8081" in s)
    assert path[-1].startswith("tuner watch")
