"""Write version 2 of the open-loop set of twin worlds (tests/lab/openworlds2.py) into
profiles/twin/openloop2/, or check that the committed files are what the generator makes.

    .venv/bin/python benchmarks/make_openloop2_worlds.py            # write
    .venv/bin/python benchmarks/make_openloop2_worlds.py --check    # compare, exit 1 on a change

The set is frozen: a world is never adjusted after seeing how a method does on it. Changing the
generator makes a new set (a new version), graded from scratch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from common import world_set_command
from lab.openworlds2 import DRAWN, GENERATOR_SEED, generate, render

OPENLOOP2 = Path(__file__).resolve().parent.parent / "profiles" / "twin" / "openloop2"


def main() -> int:
    return world_set_command(
        __doc__.splitlines()[0],
        OPENLOOP2,
        lambda: render(generate(DRAWN, GENERATOR_SEED), GENERATOR_SEED),
    )


if __name__ == "__main__":
    sys.exit(main())
