"""The topic catalogue's version: one row, counted up by a trigger in every transaction that creates
or deletes a topic or changes its partition count, so a consumer group subscribed by regular
expression reads every topic again only when the catalogue changed since it last did; and, with
each consumer group, the version it last resolved its subscriptions at

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "topics_version",
        sa.Column("one", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("version", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.CheckConstraint("one", name="topics_version_one_row"),
        sa.PrimaryKeyConstraint("one"),
        schema="txlog",
    )
    op.execute("INSERT INTO txlog.topics_version (one, version) VALUES (true, 0)")
    op.execute(
        """
        CREATE FUNCTION txlog.topics_version_bump() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          UPDATE txlog.topics_version SET version = version + 1;
          RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER topics_version_bump AFTER INSERT OR DELETE OR UPDATE OF partitions ON txlog.topics "
        "FOR EACH STATEMENT EXECUTE FUNCTION txlog.topics_version_bump()"
    )
    op.add_column("consumer_group_metadata", sa.Column("topics_version", sa.BigInteger(), nullable=True), schema="txlog")


def downgrade() -> None:
    op.drop_column("consumer_group_metadata", "topics_version", schema="txlog")
    op.execute("DROP TRIGGER topics_version_bump ON txlog.topics")
    op.execute("DROP FUNCTION txlog.topics_version_bump()")
    op.drop_table("topics_version", schema="txlog")
