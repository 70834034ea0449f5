"""The launch queue's room: the controller's tick and loop, what it launches and kills
(fleet_ops, local_fleet, daemons), the scopes and scalers it reads, the providers it goes
through, and the feed of what it decided. The task queue's use cases live beside it in
:mod:`lakeshore.services`."""
