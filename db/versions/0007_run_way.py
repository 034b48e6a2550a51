"""runs record how they switched between policies (relaunch, live, twin)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("way", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_runs", schema=None) as batch_op:
        batch_op.drop_column("way")
