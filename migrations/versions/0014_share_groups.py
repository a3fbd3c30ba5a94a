"""Share groups' membership (KIP-932): the group row whose lock serialises its heartbeats, its
members with their epochs, subscriptions, assignments and session deadlines; the group configs
under Kafka's names; the views of share groups, their members and their in-flight records

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_NAMES_0013 = (
    "name IN ('share.auto.offset.reset', 'share.isolation.level', 'share.record.lock.duration.ms', "
    "'share.delivery.count.limit', 'share.group.session.timeout.ms')"
)
_NAMES = (
    "name IN ('share.auto.offset.reset', 'share.isolation.level', 'share.record.lock.duration.ms', "
    "'share.delivery.count.limit', 'share.session.timeout.ms', 'share.heartbeat.interval.ms')"
)

# The views as this revision creates them (a later revision that changes them carries its own copy).
SHARE_GROUPS = """
CREATE OR REPLACE VIEW txlog.share_groups AS
SELECT g.group_id,
       CASE WHEN count(m.member_id) > 0 THEN 'Stable' ELSE 'Empty' END AS state,
       g.group_epoch,
       g.assignment_epoch,
       count(m.member_id) AS members,
       g.created_at,
       g.updated_at
FROM txlog.share_group_metadata g
LEFT JOIN txlog.share_group_member_metadata m ON m.group_id = g.group_id
GROUP BY g.group_id
"""

SHARE_GROUP_MEMBERS = """
CREATE OR REPLACE VIEW txlog.share_group_members AS
SELECT m.group_id,
       m.member_id,
       m.member_epoch,
       m.client_id,
       m.client_host,
       m.rack_id,
       m.subscribed_topic_names,
       m.assignment,
       to_timestamp(m.session_deadline_ms / 1000.0) AS session_deadline,
       (SELECT count(*) FROM txlog.share_in_flight f
         WHERE f.group_id = m.group_id AND f.member_id = m.member_id AND f.state = 1) AS acquired_runs,
       (SELECT coalesce(sum(f.last_offset - f.first_offset + 1), 0) FROM txlog.share_in_flight f
         WHERE f.group_id = m.group_id AND f.member_id = m.member_id AND f.state = 1) AS acquired_records
FROM txlog.share_group_member_metadata m
"""

SHARE_IN_FLIGHT_RECORDS = """
CREATE OR REPLACE VIEW txlog.share_in_flight_records AS
SELECT f.group_id,
       f.topic,
       f.partition,
       f.first_offset,
       f.last_offset,
       f.last_offset - f.first_offset + 1 AS records,
       CASE f.state WHEN 0 THEN 'Available' WHEN 1 THEN 'Acquired' WHEN 2 THEN 'Acknowledged'
                    WHEN 4 THEN 'Archived' END AS state,
       f.delivery_count,
       f.member_id AS lock_holder,
       to_timestamp(f.lock_deadline_ms / 1000.0) AS lock_deadline,
       p.start_offset AS share_partition_start_offset,
       p.end_offset AS share_partition_end_offset
FROM txlog.share_in_flight f
JOIN txlog.share_partitions p USING (group_id, topic, partition)
WHERE f.first_offset >= p.start_offset
"""


def upgrade() -> None:
    op.create_table(
        "share_group_metadata",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("group_epoch", sa.Integer(), nullable=False),
        sa.Column("assignment_epoch", sa.Integer(), nullable=False),
        sa.Column(
            "subscription_metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("group_id"),
        schema="txlog",
    )
    op.create_table(
        "share_group_member_metadata",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=False),
        sa.Column("member_epoch", sa.Integer(), nullable=False),
        sa.Column("previous_member_epoch", sa.Integer(), nullable=False),
        sa.Column("subscribed_topic_names", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("assignment", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("target_assignment", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("session_deadline_ms", sa.BigInteger(), nullable=False),
        sa.Column("rack_id", sa.Text(), nullable=True),
        sa.Column("client_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("client_host", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["txlog.share_group_metadata.group_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("group_id", "member_id"),
        schema="txlog",
    )
    op.create_index(
        "share_group_member_metadata_session_deadline", "share_group_member_metadata", ["session_deadline_ms"], schema="txlog"
    )
    # Kafka's names of the membership's group configs (KIP-932's GroupConfig).
    op.drop_constraint("share_group_configs_name", "share_group_configs", schema="txlog")
    op.execute(
        "UPDATE txlog.share_group_configs SET name = 'share.session.timeout.ms' WHERE name = 'share.group.session.timeout.ms'"
    )
    op.create_check_constraint("share_group_configs_name", "share_group_configs", _NAMES, schema="txlog")
    op.execute(SHARE_GROUPS)
    op.execute(SHARE_GROUP_MEMBERS)
    op.execute(SHARE_IN_FLIGHT_RECORDS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS txlog.share_in_flight_records")
    op.execute("DROP VIEW IF EXISTS txlog.share_group_members")
    op.execute("DROP VIEW IF EXISTS txlog.share_groups")
    op.drop_constraint("share_group_configs_name", "share_group_configs", schema="txlog")
    op.execute("DELETE FROM txlog.share_group_configs WHERE name = 'share.heartbeat.interval.ms'")
    op.execute(
        "UPDATE txlog.share_group_configs SET name = 'share.group.session.timeout.ms' WHERE name = 'share.session.timeout.ms'"
    )
    op.create_check_constraint("share_group_configs_name", "share_group_configs", _NAMES_0013, schema="txlog")
    op.drop_index("share_group_member_metadata_session_deadline", table_name="share_group_member_metadata", schema="txlog")
    op.drop_table("share_group_member_metadata", schema="txlog")
    op.drop_table("share_group_metadata", schema="txlog")
