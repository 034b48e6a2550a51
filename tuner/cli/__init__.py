"""The `tuner` command line."""

from tuner.cli.app import app

__all__ = ["app"]
