"""How the daemon and its pool children talk: length-prefixed pickled tuples on a socket.

Each message is a 4-byte big-endian length and a pickle. Several may go in one write
(:func:`pack_all`), and one read may bring several (:class:`Frames` cuts them apart), so
a child that reports a few outcomes at once, or a daemon that reads a child's ``begin``
and ``done`` together, pays one system call for them. ``multiprocessing.connection``
framed the same way one message per call, and importing it cost a child ~8 ms of its
start; this module needs only :mod:`pickle` and :mod:`struct`.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

_HEADER = struct.Struct("!I")
READ_SIZE = 1 << 16


def pack(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def pack_all(messages: list[tuple[Any, ...]]) -> bytes:
    return b"".join(pack(message) for message in messages)


class Frames:
    """The messages in a stream of bytes, as they are completed by what is fed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        buffer = self._buffer
        buffer += data
        messages: list[tuple[Any, ...]] = []
        start, end = 0, len(buffer)
        while end - start >= 4:
            (size,) = _HEADER.unpack_from(buffer, start)
            if end - start - 4 < size:
                break
            messages.append(pickle.loads(buffer[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of a message not yet complete."""
        return len(self._buffer)
