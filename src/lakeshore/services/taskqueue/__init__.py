"""The task queue's room: submits and reads (invocations), claims and their long-poll,
the hand-off of a fresh submit to a waiting claim, wake-ups (notify), streams, the
reaper, schedules and the retention sweep. The launch queue's use cases are in
:mod:`lakeshore.services.fleet`; what both share stays in :mod:`lakeshore.services`."""
