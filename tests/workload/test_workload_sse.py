"""workload.sse.events: the one reader of the streamed completions' framing (the client and the load test)."""

import pytest

from workload.sse import events


def test_data_lines_in_order_until_done_and_nothing_after():
    lines = [b": keepalive\n", b"event: message\n", b'data: {"n": 1}\r\n', b"\n", b'data: {"n": 2}\n',
             b"data: [DONE]\n", b'data: {"n": 3}\n']
    assert list(events(lines)) == [{"n": 1}, {"n": 2}]


def test_a_stream_that_ends_without_done_gives_what_it_sent():
    assert list(events([b'data: {"n": 1}\n'])) == [{"n": 1}]
    assert list(events([])) == []


def test_a_payload_that_is_not_json_raises_value_error():
    with pytest.raises(ValueError):
        list(events([b"data: {not json\n"]))
