"""Write the frozen set of twin worlds (tests/lab/frozen.py) into profiles/twin/frozen/, or check
that the committed files are what the generator makes.

    .venv/bin/python benchmarks/make_frozen_worlds.py            # write
    .venv/bin/python benchmarks/make_frozen_worlds.py --check    # compare, exit 1 on a change

The set is frozen: a world is never adjusted after seeing how the tuner does on it. Changing the
generator makes a new set (raise lab.frozen.GENERATOR_VERSION), graded from scratch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common import world_set_command
from lab.frozen import GENERATOR_SEED, WORLD_COUNT, generate, render_set

FROZEN = Path(__file__).resolve().parent.parent / "profiles" / "twin" / "frozen"


def main() -> int:
    return world_set_command(
        __doc__.splitlines()[0],
        FROZEN,
        lambda: render_set(generate(WORLD_COUNT, GENERATOR_SEED), GENERATOR_SEED),
    )


if __name__ == "__main__":
    sys.exit(main())
