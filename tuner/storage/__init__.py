"""Storage: the ORM models (orm), the database and its migrations (engine), and the queries the
commands read results back with (queries, fits, recommendations); imports of outside tables."""
