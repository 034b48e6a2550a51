"""validation runs name what they checked: the recommendation and the N measured as it

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("recommendation_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("validated_max_slots", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_tuner_runs_recommendation_id",
            "tuner_recommendations",
            ["recommendation_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("tuner_runs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_tuner_runs_recommendation_id", type_="foreignkey")
        batch_op.drop_column("validated_max_slots")
        batch_op.drop_column("recommendation_id")
