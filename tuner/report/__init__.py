"""Reporting: what the report draws (series), the figure (figure), the Markdown summary (summary),
tables shared with the CLI (tables), and reading the database and writing the files (writer)."""
