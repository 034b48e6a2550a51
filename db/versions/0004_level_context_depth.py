"""levels carry their context depth: one level per (run, config, concurrency, depth)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = ["run_id", "config", "concurrency"]
NEW_NAME = "uq_tuner_levels_run_config_concurrency_depth"
# SQLite leaves the old constraint unnamed: batch mode names it by this convention to drop it.
SQLITE_NAMES = {"uq": "uq_%(table_name)s_%(column_0_N_name)s"}


def _old_name(bind: sa.engine.Connection) -> str | None:
    for uq in sa.inspect(bind).get_unique_constraints("tuner_levels"):
        if list(uq["column_names"]) == OLD:
            return uq["name"]
    return None


def upgrade() -> None:
    bind = op.get_bind()
    column = sa.Column("context_tokens", sa.Integer(), nullable=False, server_default="0")
    if bind.dialect.name == "sqlite":
        with op.batch_alter_table(
            "tuner_levels", recreate="always", naming_convention=SQLITE_NAMES
        ) as batch_op:
            batch_op.add_column(column)
            batch_op.drop_constraint("uq_tuner_levels_run_id_config_concurrency", type_="unique")
            batch_op.create_unique_constraint(NEW_NAME, [*OLD, "context_tokens"])
        return
    op.add_column("tuner_levels", column)
    name = _old_name(bind)
    if name:
        op.drop_constraint(name, "tuner_levels", type_="unique")
    op.create_unique_constraint(NEW_NAME, "tuner_levels", [*OLD, "context_tokens"])


def downgrade() -> None:
    with op.batch_alter_table("tuner_levels", schema=None) as batch_op:
        batch_op.drop_constraint(NEW_NAME, type_="unique")
        batch_op.create_unique_constraint("uq_tuner_levels_run_id_config_concurrency", OLD)
        batch_op.drop_column("context_tokens")
