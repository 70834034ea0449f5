"""Lakeshore: a control plane for elastic queues."""

__version__ = "0.1.0"
