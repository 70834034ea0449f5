"""Lakeshore: a control plane for elastic queues."""

from lakeshore.sdk import Client, Handle, RemoteError, udf

__version__ = "0.1.0"
__all__ = ["Client", "Handle", "RemoteError", "__version__", "udf"]
