"""Write the open-loop set of twin worlds (tests/lab/openworlds.py) into profiles/twin/openloop/,
or check that the committed files are what the generator makes.

    .venv/bin/python benchmarks/make_openloop_worlds.py            # write
    .venv/bin/python benchmarks/make_openloop_worlds.py --check    # compare, exit 1 on a change

The set is frozen: a world is never adjusted after seeing how a method does on it. Changing the
generator makes a new set (raise lab.openworlds.GENERATOR_VERSION), graded from scratch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common import world_set_command
from lab.openworlds import DRAWN, GENERATOR_SEED, generate, render_set

OPENLOOP = Path(__file__).resolve().parent.parent / "profiles" / "twin" / "openloop"


def main() -> int:
    return world_set_command(
        __doc__.splitlines()[0],
        OPENLOOP,
        lambda: render_set(generate(DRAWN, GENERATOR_SEED), GENERATOR_SEED),
    )


if __name__ == "__main__":
    sys.exit(main())
