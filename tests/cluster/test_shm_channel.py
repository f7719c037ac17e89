"""The step-plan channel (cluster/shm_channel.py): every message reaches every reader exactly
once, in order, even when a reader looks at a counter word while it is being stored."""
import pickle
import threading

import pytest

from hybrid_serve.cluster.shm_channel import ShmChannel


@pytest.fixture
def channel_pair():
    writer = ShmChannel(None, 1, capacity=4096)
    reader = ShmChannel(writer.name, 1, reader_index=0)
    yield writer, reader
    reader.close()
    writer.close(unlink=True)


def test_messages_arrive_once_in_order_across_threads(channel_pair):
    writer, reader = channel_pair
    got = []
    thread = threading.Thread(target=lambda: got.extend(reader.recv() for _ in range(600)))
    thread.start()
    for i in range(600):  # past 256 and 512: the counters' low bytes wrap
        writer.send({"step": i, "rows": list(range(i % 5))})
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert [m["step"] for m in got] == list(range(600))


def test_half_stored_counter_is_not_taken_as_a_new_message(channel_pair):
    """A reader that sees seq mid-store (255 -> 256, low byte written first: 0) must keep
    waiting, and then take message 256 exactly once (it used to take it twice)."""
    writer, reader = channel_pair
    for i in range(255):
        writer.send(i)
        assert reader.recv() == i
    # the writer has put message 255's payload and length, and stored only seq's low byte
    payload = pickle.dumps("m255")
    writer.buf[writer.header: writer.header + len(payload)] = payload
    writer._set_word(1, len(payload))
    writer.buf[0] = 0  # seq bytes now read 0x00 0x00 ...: neither 255 nor 256
    got = []
    thread = threading.Thread(target=lambda: got.append(reader.recv()))
    thread.start()
    thread.join(timeout=0.2)
    assert thread.is_alive() and not got  # still waiting for 256
    writer._set_word(0, 256)  # the store completes
    writer._seq = 256
    thread.join(timeout=10)
    assert got == ["m255"]
    assert writer._word(2) == 256  # acked with the real counter
    writer.send("next")
    assert reader.recv() == "next"  # not "m255" a second time


def test_writer_waits_for_the_reader_and_times_out_naming_it(channel_pair):
    writer, reader = channel_pair
    writer.timeout_s = 0.2
    writer.send("a")
    with pytest.raises(RuntimeError, match="shard rank 1 did not take plan 1"):
        writer.send("b")  # the reader has not taken "a"
    assert reader.recv() == "a"
    writer.send("b")
    assert reader.recv() == "b"
