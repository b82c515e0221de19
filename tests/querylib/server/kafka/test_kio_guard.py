"""kio's native decoder trusts the lengths and counts it reads: a count of ~10^10 makes it
allocate tens of GB and the process aborts ("memory allocation of N bytes failed"), which
Python cannot catch. Every decode of network bytes is guarded by a shape walk first
(`querylib/_kio_shape.py`); these tests run the decoding in CHILD processes so an abort is
seen (exit by signal, "memory allocation" on stderr) instead of killing the test run:

- the reproducer (a Fetch v12 body whose topics array claims ~10^10 entries) raises
  MalformedRequestError;
- a live listener answered that request, framed, on one connection and keeps serving Kafka
  clients;
- a seeded fuzz of random and mutated bodies of every served (api key, version): every failure
  is MalformedRequestError;
- the same for the responses tq's own Kafka client decodes.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from querylib.kafka._apis import is_flexible

REPRODUCER = ("0001b3ff6e5b73a6017f37c27f32c117ff00ab30007f8d3affc0d4f1ff2d01f900"
              "7affb9017f0500012fd763")
ROOT = Path(__file__).resolve().parents[4]  # the checkout (tests/querylib/server/kafka/..)


# The children run with 3 GB of address space, as under a container's memory limit: a count
# of 2^31 - 1 (the most a legacy array can claim) then fails its allocation too, where this
# machine's overcommit would grant the 17 GB it asks for and not touch them.
_LIMIT_MEMORY = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"


def _run_child(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _LIMIT_MEMORY + textwrap.dedent(code)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _assert_survived(child: subprocess.CompletedProcess[str]) -> None:
    assert "memory allocation" not in child.stderr, child.stderr[-2000:]
    assert child.returncode == 0, (child.returncode, child.stdout[-2000:], child.stderr[-2000:])


def test_reproducer_raises_malformed_request_not_abort() -> None:
    child = _run_child(f"""
        from querylib.kafka._apis import decode_request
        from querylib.kafka._errors import MalformedRequestError
        try:
            decode_request(1, 12, bytes.fromhex("{REPRODUCER}"), 0)
        except MalformedRequestError as exc:
            print("refused:", exc)
        else:
            raise SystemExit("decoded")
    """)
    _assert_survived(child)
    assert "refused:" in child.stdout


_FUZZ_CHILD = """
    import random, sys, io
    from kio.serial import entity_writer
    from querylib.kafka import SUPPORTED_VERSIONS, ApiKey
    from querylib.kafka._apis import {decoder}, _payload_class
    from querylib.kafka._errors import MalformedRequestError
    from catalog.errors import ProtocolError
    from kio.static.constants import EntityType
    from hypothesis import strategies as st
    from kio.static.primitive import Records

    ERRORS = (MalformedRequestError, ProtocolError)
    rng = random.Random({seed})
    SERVED = [(k, v) for k, (lo, hi) in SUPPORTED_VERSIONS.items() for v in range(lo, hi + 1)
              if not (k == ApiKey.PRODUCE and v < 3)]
    if {only!r}:
        SERVED = [s for s in SERVED if s in {only!r}]
    st.register_type_strategy(Records, st.binary(max_size=32).map(Records))

    def valid(key, version):
        cls = _payload_class(key, version, EntityType.{entity})
        buffer = io.BytesIO()
        entity_writer(cls)(buffer, st.from_type(cls).example())
        return buffer.getvalue()

    def mutate(body):
        data = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.4 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif choice < 0.6 and data:
                # a large count or length where one may be
                pos = rng.randrange(len(data))
                data[pos:pos + 4] = rng.choice([b"\\x7f\\xff\\xff\\xff", b"\\xff\\xff\\xff\\x0f",
                                                b"\\x00\\x7f\\xff\\xff", b"\\xf0\\xff\\xff\\x7f"])
            elif choice < 0.8:
                data = data[:rng.randrange(len(data) + 1)]
            else:
                pos = rng.randrange(len(data) + 1)
                data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        return bytes(data)

    import warnings
    warnings.filterwarnings("ignore")
    failures = 0
    for key, version in SERVED:
        seeds = []
        for _ in range(2):
            try:
                seeds.append(valid(key, version))
            except Exception:
                pass
        for i in range({count}):
            if i % 2 or not seeds:
                body = rng.randbytes(rng.randint(0, 96))
            else:
                body = mutate(rng.choice(seeds))
            try:
                {decoder}(key, version, body, 0)
            except ERRORS:
                failures += 1
    print("ok", len(SERVED), failures)
"""


@pytest.mark.parametrize("seed", [20261126, 7])
def test_fuzzed_request_bodies_raise_malformed_request_only(seed: int) -> None:
    child = _run_child(_FUZZ_CHILD.format(decoder="decode_request", seed=seed, count=40,
                                          only=(), entity="request"), timeout=600)
    _assert_survived(child)
    assert child.stdout.startswith("ok"), child.stdout


def test_fuzzed_response_bodies_raise_protocol_error_only() -> None:
    child = _run_child(_FUZZ_CHILD.format(decoder="decode_response", seed=11, count=40,
                                          only=(), entity="response"), timeout=600)
    _assert_survived(child)
    assert child.stdout.startswith("ok"), child.stdout


def test_metadata_response_with_huge_count_raises_protocol_error() -> None:
    # MetadataResponse v12: throttle, brokers compact array claiming ~2^32 entries.
    body = struct.pack(">i", 0) + bytes([0xff, 0xff, 0xff, 0xff, 0x0f]) + b"\x00" * 8
    child = _run_child(f"""
        from querylib.kafka._apis import decode_response
        from catalog.errors import ProtocolError
        try:
            decode_response(3, 12, bytes.fromhex("{body.hex()}"), 0)
        except ProtocolError as exc:
            print("refused:", exc)
        else:
            raise SystemExit("decoded")
    """)
    _assert_survived(child)
    assert "refused:" in child.stdout


_LISTENER_CHILD = """
    import asyncio, sys
    from querylib.server import serve_local

    async def main():
        async with serve_local(sys.argv[1], "127.0.0.1", 0) as listener:
            print(listener.port, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    asyncio.run(main())
"""


def _frame(api_key: int, version: int, body: bytes, correlation_id: int = 7) -> bytes:
    client_id = b"guard-test"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if is_flexible(api_key, version):
        header += b"\x00"  # tagged fields of header v2
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def test_listener_survives_the_reproducer_and_keeps_serving(tmp_path: Path) -> None:
    kafka = pytest.importorskip("kafka")
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_LISTENER_CHILD), str(tmp_path / "data")],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(_frame(1, 12, bytes.fromhex(REPRODUCER)))
            # answered or closed: either way, reading ends without the process dying
            try:
                while sock.recv(65536):
                    pass
            except (ConnectionResetError, TimeoutError):
                pass
        assert child.poll() is None, child.communicate(timeout=30)[1][-2000:]
        topic = f"t-{uuid.uuid4().hex[:8]}"
        producer = kafka.KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}")
        try:
            producer.send(topic, b"after").get(timeout=60)
        finally:
            producer.close()
        consumer = kafka.KafkaConsumer(topic, bootstrap_servers=f"127.0.0.1:{port}",
                                       auto_offset_reset="earliest", consumer_timeout_ms=30_000)
        try:
            values = [next(consumer).value]
        finally:
            consumer.close()
        assert values == [b"after"]
        assert child.poll() is None
    finally:
        if child.poll() is None:
            child.stdin.close()  # type: ignore[union-attr]
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(30)
        stderr = child.stderr.read() if child.stderr else ""
        assert "memory allocation" not in stderr, stderr[-2000:]


_HUGE_I32 = struct.pack(">i", 0x7FFFFFFF)
_EMPTY_STR = struct.pack(">h", 0)
_NULL_STR = struct.pack(">h", -1)


@pytest.mark.parametrize("call, error", [
    # a consumer subscription (JoinGroup metadata) claiming 2^31 - 1 topics
    (f"decode_subscription(bytes.fromhex('0000{_HUGE_I32.hex()}'))", "ProtocolError"),
    # a consumer assignment (SyncGroup) claiming 2^31 - 1 topics
    (f"decode_assignment(bytes.fromhex('0000{_HUGE_I32.hex()}'))", "ProtocolError"),
    # a __consumer_offsets group value v3 claiming 2^31 - 1 members
    ("decode_offsets_record(bytes.fromhex('00020001' + '67'), bytes.fromhex('0003' + '"
     + (_EMPTY_STR + struct.pack(">i", 1) + _NULL_STR + _NULL_STR + struct.pack(">q", 0)
        + _HUGE_I32).hex() + "'))", "StorageError"),
], ids=["subscription", "assignment", "offsets-group-value"])
def test_other_kio_decodes_refuse_huge_counts(call: str, error: str) -> None:
    child = _run_child(f"""
        from querylib.api._group import decode_subscription, decode_assignment
        from querylib.server.kafka._offsets_format import decode_offsets_record
        from catalog.errors import {error}
        try:
            {call}
        except {error} as exc:
            print("refused:", exc)
        else:
            raise SystemExit("decoded")
    """)
    _assert_survived(child)
    assert "refused:" in child.stdout


def test_the_walk_of_every_valid_body_ends_where_kio_ends() -> None:
    """No false alarms: for random valid bodies of every served request and response (and the
    consumer protocol's and __consumer_offsets' entities), the shape walk accepts them and
    stops exactly where kio's decode stops."""
    import io
    import warnings

    from hypothesis import strategies as st
    from kio.serial import entity_reader, entity_writer
    from kio.static.constants import EntityType
    from kio.static.primitive import Records

    from querylib._kio_shape import _walker
    from querylib.kafka import SUPPORTED_VERSIONS, ApiKey
    from querylib.kafka._apis import _payload_class

    st.register_type_strategy(Records, st.binary(max_size=32).map(Records))
    classes = [_payload_class(key, version, entity_type)
               for key, (lo, hi) in SUPPORTED_VERSIONS.items() for version in range(lo, hi + 1)
               if not (key == ApiKey.PRODUCE and version < 3)
               for entity_type in (EntityType.request, EntityType.response)]
    checked = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls in classes:
            for _ in range(3):
                # kio refuses some drawn values, writing or reading them back (a timedelta
                # beyond int32 milliseconds): draw again until a body round-trips.
                for _attempt in range(20):
                    buffer = io.BytesIO()
                    try:
                        entity_writer(cls)(buffer, st.from_type(cls).example())
                        body = b"\x01\x02" + buffer.getvalue()
                        _, size = entity_reader(cls)(body, 2)
                        break
                    except (ValueError, OverflowError, struct.error):
                        continue
                else:
                    raise AssertionError(f"no {cls.__name__} drawn that kio round-trips")
                assert _walker(cls)(body, 2, len(body)) == 2 + size == len(body), cls
                checked += 1
    assert checked == 3 * len(classes)
