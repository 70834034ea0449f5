"""Use cases: what the API and CLI ask for, composed from the store and the domain.

The task queue's (submits, claims, hand-offs, streams, the reaper, schedules, retention)
and what both halves share (namespaces, tokens, queues, auth, metrics) are here; the
launch queue's are in :mod:`lakeshore.services.fleet`."""
