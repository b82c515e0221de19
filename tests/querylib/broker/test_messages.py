"""The broker's RPC messages on the wire: a field renamed in the code keeps its wire name, so a
client and a broker of either side of the rename still understand each other."""

import msgspec

from querylib.broker.messages import OpenProducerRequest


class _BeforeCohorts(msgspec.Struct):
    """The fields of OpenProducerRequest a peer from before cohorts had their name reads."""

    session: str
    topic: str
    partition: int
    group: str = ""
    writer: str = ""
    writers: int = 0


def test_a_cohort_travels_as_group_both_ways() -> None:
    new = OpenProducerRequest(session="s", topic="t", partition=0, cohort="q1/t#0", writer="1",
                              writers=2)
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=_BeforeCohorts)
    assert (old.group, old.writer, old.writers) == ("q1/t#0", "1", 2)
    back = msgspec.msgpack.decode(
        msgspec.msgpack.encode({**msgspec.structs.asdict(old), "type": "broker.producer.open"}),
        type=OpenProducerRequest)
    assert (back.cohort, back.writer, back.writers) == ("q1/t#0", "1", 2)
