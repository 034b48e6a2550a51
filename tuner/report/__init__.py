"""Reporting: the figure (aggregate and per-stream tok/s, model curves, policy, crossover) and the
Markdown summary, written into one folder by `tuner report`."""
