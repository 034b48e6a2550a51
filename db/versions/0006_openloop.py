"""open-loop validation results: one row per configuration and arrival rate

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_openloop",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("config", sa.String(length=64), nullable=False),
        sa.Column("max_slots", sa.Integer(), nullable=True),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["tuner_runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "config", "rate"),
    )
    with op.batch_alter_table("tuner_openloop", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tuner_openloop_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tuner_openloop", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tuner_openloop_run_id"))
    op.drop_table("tuner_openloop")
