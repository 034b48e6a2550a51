"""file hashes: full sha256s kept per host and path; a model's content_id

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tuner_file_hashes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("path", sa.String(length=4096), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("mtime_ns", sa.BigInteger(), nullable=False),
        sa.Column("content_id", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("hashed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("host", "path"),
    )
    with op.batch_alter_table("tuner_models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("content_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_models", schema=None) as batch_op:
        batch_op.drop_column("content_id")

    op.drop_table("tuner_file_hashes")
