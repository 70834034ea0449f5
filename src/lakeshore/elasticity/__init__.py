"""Elasticity as one pure plan: what the controller would do, computed without I/O.

:func:`lakeshore.elasticity.plan.plan` takes a :class:`~.snapshot.Snapshot` (the active
queues, their workers, pending and running counts, launches in flight and hysteresis
counters) and returns one :class:`~.plan.Step` per queue or pool: the signals, the
decision with its reason and rule, the victim of a scale-down, the launch of a scale-up
and the downgrade it takes when it cannot act. The controller's tick, ``stats``,
``explain`` and ``lakeshore simulate`` all call it, so they agree by construction.
"""
