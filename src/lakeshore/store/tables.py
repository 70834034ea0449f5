"""The schema: every table Lakeshore keeps, on SQLite and PostgreSQL alike.

Changes to this file come with an Alembic revision in ``migrations/versions``; a test
checks that the two agree. Indexes serve the hot queries named beside them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from lakeshore.store.types import Json, UTCDateTime

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

ID = String(40)
# the finished states, as the retention sweep and its partial index both spell them (a
# partial index serves a query whose condition is written as its own)
FINISHED = "state IN ('succeeded', 'failed', 'cancelled', 'expired')"
# pending work due after its own submit (a retry's backoff, a delayed submit), as
# ix_invocations_deferred and the queries it serves spell it
DEFERRED = "state = 'pending' AND available_at > created_at"
# running rows with a concurrency key: what a per-key limit counts (0015)
RUNNING_KEYED = "state = 'running' AND concurrency_key IS NOT NULL"
# pending rows with a concurrency key: what a claim takes turns between (0016)
PENDING_KEYED = "state = 'pending' AND concurrency_key IS NOT NULL"
CASCADE = "CASCADE"

namespaces = Table(
    "namespaces",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", String(63), nullable=False, unique=True),
    Column("created_at", UTCDateTime(), nullable=False),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", ID, primary_key=True),
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    # "namespace" (a user's token) or "worker" (minted for one launched daemon)
    Column("kind", String(16), nullable=False),
    Column("name", String(128), nullable=True),
    Column("secret_hash", String(64), nullable=False),
    Column("worker_id", ID, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("revoked_at", UTCDateTime(), nullable=True),
    Index(None, "namespace_id"),
)

queues = Table(
    "queues",
    metadata,
    Column("id", ID, primary_key=True),
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    Column("name", String(63), nullable=False),
    Column("description", Text, nullable=True),
    Column("kind", String(16), nullable=False),
    Column("kind_params", Json, nullable=True),
    Column("admission", Json, nullable=True),
    Column("reserved_slots", Integer, nullable=True),
    Column("auth_policy", Json, nullable=True),
    Column("provider_ref", String(63), nullable=True),
    Column("elasticity", Json, nullable=True),
    # copied out of ``elasticity`` so the controller can group pools in SQL
    Column("pool", String(63), nullable=True),
    Column("daemon_template", Json, nullable=True),
    Column("custom_scaler_udf", String(512), nullable=True),
    Column("state", String(16), nullable=False),
    Column("server_node_id", String(128), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    # counts the row's writes (spec and state): the controller re-reads a queue only
    # when it moved (0004)
    Column("revision", Integer, nullable=False, server_default="0"),
    # seconds a finished invocation is kept; null: the server's LAKESHORE_RETENTION_S (0011)
    Column("retention_s", Float, nullable=True),
    # the queue's retry policy, as written (each field optional; 0015)
    Column("retry", Json, nullable=True),
    UniqueConstraint("namespace_id", "name"),
    Index(None, "state", "pool"),  # the controller's sweep of active queues
)

providers = Table(
    "providers",
    metadata,
    Column("id", ID, primary_key=True),
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    Column("name", String(63), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("config", Json, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("namespace_id", "name"),
)

workers = Table(
    "workers",
    metadata,
    Column("id", ID, primary_key=True),  # the key leases, launches and memberships use
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    Column("name", ID, nullable=False),  # the id its namespace knows it by (0003)
    Column("launch_id", ID, nullable=True),
    Column("runners", Json, nullable=False),
    Column("tags", Json, nullable=False),
    Column("capabilities", Json, nullable=False),
    Column("max_invocations", Integer, nullable=False),
    Column("current_invocations", Integer, nullable=True),  # only when the daemon reports it
    Column("cost_weight", Float, nullable=True),
    Column("retiring", Boolean, nullable=False, server_default=text("false")),
    Column("last_seen_at", UTCDateTime(), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "namespace_id"),
    Index(None, "last_seen_at"),  # the reaper's sweep for silent workers
    Index(None, "launch_id"),
    Index(None, "namespace_id", "name", unique=True),
)

worker_queues = Table(
    "worker_queues",
    metadata,
    Column("worker_id", ID, ForeignKey("workers.id", ondelete=CASCADE), primary_key=True),
    Column("queue_id", ID, ForeignKey("queues.id", ondelete=CASCADE), primary_key=True),
    Index(None, "queue_id"),  # daemon count per queue
)

retired_workers = Table(
    "retired_workers",
    metadata,
    Column("id", ID, primary_key=True),
    Column("namespace_id", ID, nullable=False),
    Column("name", ID, nullable=False),  # refused at hello in its namespace once retired
    Column("retired_at", UTCDateTime(), nullable=False),
    Column("reason", Text, nullable=True),
    Index(None, "namespace_id", "name", unique=True),
)

invocations = Table(
    "invocations",
    metadata,
    Column("id", ID, primary_key=True),
    # its queue's namespace and its queue, without foreign keys (0007, 0017): every
    # insert reads and holds its queue's row, and a queue is never deleted (archived)
    Column("namespace_id", ID, nullable=False),
    Column("queue_id", ID, nullable=False),
    Column("queue_name", String(63), nullable=False),  # denormalized, as the model says
    Column("fn", String(512), nullable=False),
    Column("args", Json, nullable=False),
    Column("kwargs", Json, nullable=False),
    Column("priority", Float, nullable=False, server_default=text("0")),
    Column("key", String(256), nullable=True),
    # pending | running | succeeded | failed | cancelled | expired
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("1")),
    Column("timeout_s", Float, nullable=True),
    Column("worker_id", ID, nullable=True),
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    Column("available_at", UTCDateTime(), nullable=False),  # retry backoff
    Column("result", Json, nullable=True),
    Column("error", Json, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    # the attempt (its ``attempts`` value) its worker said it began: an attempt that never
    # began (prefetched, its daemon gone) goes back uncounted (0009); null: not known
    Column("begun_attempt", Integer, nullable=True),
    # the schedule that made it and the slot it stands for (0013); null: a plain submit
    Column("schedule", String(63), nullable=True),
    Column("slot", UTCDateTime(), nullable=True),
    # the effective retry policy, fixed at submit (0015); null: the default, with
    # ``max_attempts``
    Column("retry", Json, nullable=True),
    # what the queue's per-key limit counts and a claim takes turns by (0015)
    Column("concurrency_key", String(256), nullable=True),
    # idempotency: a key is unique per namespace + queue (a queue id implies both); rows
    # without a key (most) are not indexed (0007)
    Index(
        "ix_invocations_queue_id_key",
        "queue_id",
        "key",
        unique=True,
        sqlite_where=text("key IS NOT NULL"),
        postgresql_where=text("key IS NOT NULL"),
    ),
    # per-state counts for stats, a queue's invocations of some states, newest first, and
    # the next claimable invocation per queue (fifo / filo: state = 'pending', in order)
    Index(None, "queue_id", "state", "created_at", "id"),
    # a queue's invocations, newest first, a page at a time (by keyset)
    Index(None, "queue_id", "created_at", "id"),
    # the reaper's sweep for expired leases
    Index(
        "ix_invocations_leases",
        "lease_expires_at",
        sqlite_where=text("state = 'running'"),
        postgresql_where=text("state = 'running'"),
    ),
    # the retention sweep: a queue's finished invocations, oldest first, and only them (0011)
    Index(
        "ix_invocations_finished",
        "queue_id",
        "finished_at",
        sqlite_where=text(FINISHED),
        postgresql_where=text(FINISHED),
    ),
    # a worker's invocations, its running ones a range however many it has finished
    # (0008); rows without a worker (every submit's) are not indexed
    Index(
        "ix_invocations_worker_state",
        "worker_id",
        "state",
        sqlite_where=text("worker_id IS NOT NULL"),
        postgresql_where=text("worker_id IS NOT NULL"),
    ),
)

# deferred pending work by due time: a retry waiting out its backoff, a delayed submit
# not due (rows due after their own submit; a plain submit is not one, so its insert
# skips this index); a waiting claim's next due time and ``scheduled`` read it (0014)
Index(
    "ix_invocations_deferred",
    invocations.c.queue_id,
    invocations.c.available_at,
    sqlite_where=text(DEFERRED),
    postgresql_where=text(DEFERRED),
)

# a queue's running invocations of one concurrency key, counted by the per-key limit (0015)
Index(
    "ix_invocations_running_key",
    invocations.c.queue_id,
    invocations.c.concurrency_key,
    sqlite_where=text(RUNNING_KEYED),
    postgresql_where=text(RUNNING_KEYED),
)

# a queue's pending invocations of one concurrency key, in submit order: a claim's fair
# turns find the keys (one probe each) and each key's first rows from it (0016); rows
# without a key (every submit to a queue without keys) are not indexed
Index(
    "ix_invocations_pending_key",
    invocations.c.queue_id,
    invocations.c.concurrency_key,
    invocations.c.created_at,
    invocations.c.id,
    sqlite_where=text(PENDING_KEYED),
    postgresql_where=text(PENDING_KEYED),
)

# next claimable invocation per queue (priority, boltzmann): highest priority, then oldest
Index(
    "ix_invocations_claimable_priority",
    invocations.c.queue_id,
    invocations.c.priority.desc(),
    invocations.c.created_at,
    invocations.c.id,
    sqlite_where=text("state = 'pending'"),
    postgresql_where=text("state = 'pending'"),
)

# each queue's finished invocations added up to ``counted_until`` by the leading server,
# so ``stats`` reads the tally and only the rows finished since (0014); the retention
# sweep takes away what it deletes, a retry what it puts back
finished_tallies = Table(
    "finished_tallies",
    metadata,
    Column("queue_id", ID, ForeignKey("queues.id", ondelete=CASCADE), primary_key=True),
    Column("counted_until", UTCDateTime(), nullable=False),
    Column("succeeded", BigInteger, nullable=False, server_default=text("0")),
    Column("failed", BigInteger, nullable=False, server_default=text("0")),
    Column("cancelled", BigInteger, nullable=False, server_default=text("0")),
    Column("expired", BigInteger, nullable=False, server_default=text("0")),
)

# a token bucket per queue (``key`` empty) and per concurrency key, shared by every
# replica: a submit takes its tokens in its own transaction (0015)
rate_buckets = Table(
    "rate_buckets",
    metadata,
    Column("queue_id", ID, ForeignKey("queues.id", ondelete=CASCADE), primary_key=True),
    Column("key", String(256), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

stream_items = Table(
    "stream_items",
    metadata,
    Column("invocation_id", ID, ForeignKey("invocations.id", ondelete=CASCADE), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("item", Json, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

elasticity_events = Table(
    "elasticity_events",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    Column("queue_name", String(80), nullable=False),  # a queue's name, or "pool:<name>"
    Column("action", String(16), nullable=False),  # scale_up | scale_down | tick_noop
    Column("reason", Text, nullable=False),
    Column("before", Json, nullable=False),
    Column("after", Json, nullable=False),
    Column("signals", Json, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    # consecutive identical no-ops of one scope share a row: how many ticks decided it,
    # and when the last one did (NULL: only the first, at created_at) (0004)
    Column("repeats", Integer, nullable=False, server_default="1"),
    Column("last_at", UTCDateTime(), nullable=True),
    # the feed: newest first, per queue or pool, optionally without noops
    Index(None, "namespace_id", "queue_name", "id"),
    Index(
        "ix_elasticity_events_scale_feed",
        "namespace_id",
        "queue_name",
        "id",
        sqlite_where=text("action <> 'tick_noop'"),
        postgresql_where=text("action <> 'tick_noop'"),
    ),
    # the retention sweep of every event, oldest first (0011)
    Index(None, "created_at"),
    # pruning old no-ops
    Index(
        "ix_elasticity_events_noop_age",
        "created_at",
        sqlite_where=text("action = 'tick_noop'"),
        postgresql_where=text("action = 'tick_noop'"),
    ),
)

controller_state = Table(
    "controller_state",
    metadata,
    # hysteresis counters survive restarts and leader changes
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), primary_key=True),
    Column("scope", String(80), primary_key=True),  # a queue's name, or "pool:<name>"
    Column("consecutive_above", Integer, nullable=False, server_default=text("0")),
    Column("consecutive_below", Integer, nullable=False, server_default=text("0")),
    Column("updated_at", UTCDateTime(), nullable=False),
)

launches = Table(
    "launches",
    metadata,
    Column("id", ID, primary_key=True),  # the launch_id a daemon presents at hello
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    Column("scope", String(80), nullable=False),  # a queue's name, or "pool:<name>"
    Column("provider_name", String(63), nullable=False),
    # in_flight | succeeded | failed | expired
    Column("state", String(16), nullable=False),
    Column("handle", Json, nullable=True),
    Column("error", Text, nullable=True),
    Column("worker_id", ID, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Column("resolved_at", UTCDateTime(), nullable=True),
    Column("body", Json, nullable=True),  # what the provider was asked to start
    Column("token_id", ID, nullable=True),  # the worker token minted for this launch
    Column("terminated_at", UTCDateTime(), nullable=True),
    Column("terminate_error", Text, nullable=True),
    # in_flight per queue or pool
    Index(None, "namespace_id", "scope", "state"),
    Index(None, "worker_id"),
    Index(None, "namespace_id", "provider_name", "id"),  # a provider's launches
)

ui_sessions = Table(
    "ui_sessions",
    metadata,
    # a keyed hash of the session id the browser's cookie holds (never the id itself)
    Column("id_hash", String(64), primary_key=True),
    # the namespace token it signed in with; null: the admin token
    Column("token_id", ID, ForeignKey("tokens.id", ondelete=CASCADE), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Index(None, "token_id"),  # a revoked token's sessions
    Index(None, "expires_at"),  # the expired ones, deleted a batch at a time
)

schedules = Table(
    "schedules",
    metadata,
    Column("id", ID, primary_key=True),
    Column("namespace_id", ID, ForeignKey("namespaces.id", ondelete=CASCADE), nullable=False),
    Column("queue_id", ID, ForeignKey("queues.id", ondelete=CASCADE), nullable=False),
    Column("name", String(63), nullable=False),
    # the definition, as lakeshore.domain.schedules.ScheduleSpec.to_json writes it
    Column("spec", Json, nullable=False),
    Column("enabled", Boolean, nullable=False),
    # the last slot the leader dealt with (enqueued or skipped); at first the creation
    # time, so a new schedule's first slot is the first one after it (0012)
    Column("last_slot", UTCDateTime(), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("queue_id", "name"),
    Index(None, "enabled"),  # the leader's sweep of enabled schedules
)
