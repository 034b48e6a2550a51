"""The twin's build identity: what `tuner-twin-server --version` prints and what its responses
and /props report as the build. Light (the package's version alone), so that the command that
answers the probes before numpy is imported (tuner.twin.command) and the server share it
without the one importing the other."""

from __future__ import annotations

import platform

from tuner import __version__

BUILD_INFO = f"twin-{__version__}"
VERSION_TEXT = (
    f"version: 0 ({BUILD_INFO})\n"
    f"built with tuner twin on Python {platform.python_version()} for "
    f"{platform.system()} {platform.machine()}"
)
