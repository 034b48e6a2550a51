"""`python -m tuner` runs the command line."""

from tuner.cli import app

app()
