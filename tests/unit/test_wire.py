"""The pool's wire format: messages cut apart however the bytes arrive."""

from __future__ import annotations

from lakeshore.daemon import wire


def test_several_messages_in_one_read_come_out_in_order() -> None:
    data = wire.pack_all([("begin", "1"), ("done", "1", "ok", "null", 10)])
    assert wire.Frames().feed(data) == [("begin", "1"), ("done", "1", "ok", "null", 10)]


def test_a_message_split_across_reads_comes_out_once_complete() -> None:
    data = wire.pack(("run", "7", "m:f", [1] * 1000, {}, None)) + wire.pack(("exit",))
    frames = wire.Frames()
    out = [message for byte in range(len(data)) for message in frames.feed(data[byte : byte + 1])]
    assert out == [("run", "7", "m:f", [1] * 1000, {}, None), ("exit",)]
    assert frames.pending == 0


def test_an_incomplete_message_is_kept_for_the_next_read() -> None:
    data = wire.pack(("item", "3", '"x"'))
    frames = wire.Frames()
    assert frames.feed(data[:-1]) == []
    assert frames.pending == len(data) - 1
    assert frames.feed(data[-1:]) == [("item", "3", '"x"')]
