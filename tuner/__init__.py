"""tuner: find the best --spec-draft-max-slots for a llama-server by measuring it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tuner")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"
