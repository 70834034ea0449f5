"""Use cases: what the API and CLI ask for, composed from the store and the domain.

Two rooms and a hall: the task queue's (:mod:`lakeshore.services.taskqueue`: submits,
claims, hand-offs, streams, the reaper, schedules, retention), the launch queue's
(:mod:`lakeshore.services.fleet`), and here what both share (namespaces, tokens, queues,
auth, metrics, the dashboard's sessions and overview, the cluster's housekeeping)."""
