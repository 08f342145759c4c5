"""Hostile peers: whatever a device, Slack, Matrix or Lark sends fails only itself.

A device stream that sends something malformed, oversized or out of order is closed with a
gRPC status saying why, and the replica goes on (other devices' streams keep working). A
malformed channel event is that event's failure: a clear 4xx where there is an HTTP answer,
a log line otherwise, and the next good event is processed.

The parsers are fuzzed with ``hypothesis`` (random JSON shapes and mutated real payloads);
each receiver also gets hostile input over its real transport.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import asyncpg
import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane.channels.base import Ignored
from controlplane.channels.lark import events as lark_events
from controlplane.channels.lark.adapter import LarkAdapter
from controlplane.channels.lark.callback import open_callback
from controlplane.channels.lark.client import BotInfo as LarkBot
from controlplane.channels.matrix import events as matrix_events
from controlplane.channels.matrix.client import MatrixAccount
from controlplane.channels.matrix.events import BotIdentity
from controlplane.channels.matrix.receiver import MatrixSync
from controlplane.channels.slack import SlackAdapter
from controlplane.channels.slack import events as slack_events
from controlplane.channels.slack.events import Identity as SlackIdentity
from controlplane.errors import InvalidInput, SuperagentError
from controlplane.gateway import specs
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.ingest.intake import _validate as intake_validate
from controlplane.settings import MatrixSettings, SlackSettings
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.protocol import MAX_OUTPUT_CHUNK_BYTES
from tests.controlplane.channels import test_lark as lark_tests
from tests.controlplane.channels import test_slack as slack_tests
from tests.fakes.lark_server import FakeLark
from tests.fakes.lark_server import encrypt as lark_encrypt
from tests.fakes.loopback import LoopbackFake, LoopbackServer
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, BOT_USER, FakeSlack
from tests.support.gateway_harness import FakeDevice, Gateway, connected, paired, running_gateway
from tests.support.helpers import assert_eventually, save_policy

# --- device streams over real gRPC ------------------------------------------------------


@pytest.fixture
async def gateway(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Gateway]:
    async with running_gateway(database_url, db, tmp_path) as gw:
        yield gw


async def _closed_by(
    device: FakeDevice, *messages: pb.DeviceMessage
) -> tuple[grpc.StatusCode, str]:
    for message in messages:
        await device.outgoing.put(message)
    status = await device.ended()
    return status, device.details


async def _round_trip(gateway: Gateway, device: FakeDevice, name: str) -> None:
    """``device`` (connected) still gets commands and its results are stored."""
    command_id = await gateway.queue.submit(name, specs.Exec(["echo", "ok"]))
    delivered = (await device.next("command")).command
    assert delivered.command_id == command_id
    await device.send(accepted=pb.Accepted(command_id=command_id))
    await device.send(output=pb.OutputChunk(command_id=command_id, offset=0, data=b"ok\n"))
    await device.send(
        finished=pb.Finished(command_id=command_id, exit_code=0, total_output_bytes=3)
    )
    result = await gateway.queue.wait(command_id, timeout=10)
    assert result.state == "finished"


async def test_hostile_device_messages_close_that_stream_with_a_reason(gateway: Gateway) -> None:
    # Each case: what the device sends after its handshake, the status and words expected.
    unknown = "cmd_nosuchthing"
    cases: list[tuple[str, list[pb.DeviceMessage], grpc.StatusCode, str]] = [
        ("empty", [pb.DeviceMessage()], grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (
            "second hello",
            [pb.DeviceMessage(hello=pb.Hello(device_id="dev_x"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "hello",
        ),
        (
            "output of no command",
            [pb.DeviceMessage(output=pb.OutputChunk(command_id=unknown, offset=0, data=b"x"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            unknown,
        ),
        (
            "result of no command",
            [pb.DeviceMessage(finished=pb.Finished(command_id=unknown, exit_code=0))],
            grpc.StatusCode.INVALID_ARGUMENT,
            unknown,
        ),
        (
            "an id with NUL",
            [pb.DeviceMessage(accepted=pb.Accepted(command_id="cmd_\x00x"))],
            grpc.StatusCode.INVALID_ARGUMENT,
            "command id",
        ),
        (
            "an oversized chunk",
            [
                pb.DeviceMessage(
                    output=pb.OutputChunk(
                        command_id=unknown, offset=0, data=b"x" * (MAX_OUTPUT_CHUNK_BYTES + 1)
                    )
                )
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "64 KiB",
        ),
    ]
    wrong = []
    async with connected(gateway, "good") as good:
        for number, (what, messages, code, words) in enumerate(cases):
            device = await paired(gateway, f"rogue{number}")
            await device.connect()
            try:
                status, details = await _closed_by(device, *messages)
            finally:
                await device.close()
            if status != code or words.lower() not in details.lower():
                wrong.append(f"{what}: {status} {details!r}")
        await _round_trip(gateway, good, "good")
    assert not wrong, wrong


async def test_out_of_range_and_nul_fields_of_a_real_command(gateway: Gateway) -> None:
    async with connected(gateway, "good") as good:
        device = await paired(gateway, "rogue")
        await device.connect()
        try:
            command_id = await gateway.queue.submit("rogue", specs.Exec(["true"]))
            await device.next("command")
            # Output far past what was stored (out of order): not stored, and the ack
            # tells the device where to resume; the stream stays.
            await device.send(
                output=pb.OutputChunk(command_id=command_id, offset=2**64 - 1, data=b"x")
            )
            ack = await device.next("ack")
            assert (ack.ack.acked_output_offset, ack.ack.finished) == (0, False)
            # A result whose texts hold NUL (a daemon's bug, or a hostile one) is still
            # stored: the device would resend it forever otherwise.
            await device.send(
                finished=pb.Finished(command_id=command_id, exit_code=1, error="bad\x00error")
            )
            ack = await device.next("ack")
            while not ack.ack.finished:
                ack = await device.next("ack")
            result = await gateway.queue.result(command_id)
            assert result.state == "failed"
            # Duplicates, and output after the end: answered, nothing changes, stream stays.
            for _ in range(2):
                await device.send(finished=pb.Finished(command_id=command_id, exit_code=0))
                await device.send(
                    output=pb.OutputChunk(command_id=command_id, offset=0, data=b"late")
                )
                await device.send(accepted=pb.Accepted(command_id=command_id))
            ack = await device.next("ack")
            while not ack.ack.finished:
                ack = await device.next("ack")
            assert (await gateway.queue.result(command_id)).state == "failed"
            assert device.status is None  # still open
        finally:
            await device.close()
        await _round_trip(gateway, good, "good")


async def test_nonsense_bytes_and_bad_hellos_end_only_their_stream(gateway: Gateway) -> None:
    async with connected(gateway, "good") as good:
        async with gateway.channel() as channel:
            connect = channel.stream_stream(
                "/superagent.endpoint.v1.EndpointGateway/Connect",
                request_serializer=None,  # raw bytes on the wire
                response_deserializer=pb.ServerMessage.FromString,
            )
            for garbage in (b"\xff\xff\xff\xff", b"\x0a\x05\x0a\x03\xff\xfe\xfd"):
                call = connect(iter([garbage]))
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in call:
                        pass
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
                assert "does not parse" in (raised.value.details() or "")
        # A Hello naming no real device: refused as unknown, not a gateway error.
        for device_id in ("dev_\x00", "x" * 10_000):
            device = await paired(gateway, f"pretender{len(device_id)}")
            device.device_id = device_id
            await device.connect()
            try:
                status = await device.ended()
            finally:
                await device.close()
            assert status == grpc.StatusCode.UNAUTHENTICATED, device.details
            assert "unknown device" in device.details
        # Over gRPC's message limit: refused by gRPC itself.
        device = await paired(gateway, "big")
        await device.connect()
        try:
            status, _details = await _closed_by(
                device,
                pb.DeviceMessage(output=pb.OutputChunk(command_id="cmd_x", data=b"x" * (9 << 20))),
            )
            assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await device.close()
        await _round_trip(gateway, good, "good")


def _random_device_message(rng: random.Random, command_id: str) -> pb.DeviceMessage:
    """A well-formed protobuf with random contents: ids real, empty, bogus or with NUL."""
    ids = [command_id, "", "cmd_\x00", "x" * 200, "cmd_" + rng.randbytes(6).hex(), "ü" * 50]
    target = rng.choice(ids)
    kind = rng.choice(["accepted", "output", "finished", "refused", "awaiting_approval", "hb"])
    if kind == "accepted":
        return pb.DeviceMessage(accepted=pb.Accepted(command_id=target))
    if kind == "output":
        size = rng.choice([0, 1, 100, MAX_OUTPUT_CHUNK_BYTES, MAX_OUTPUT_CHUNK_BYTES + 1])
        offset = rng.choice([0, 1, 2**63, 2**64 - 1, rng.randrange(2**64)])
        return pb.DeviceMessage(
            output=pb.OutputChunk(command_id=target, offset=offset, data=rng.randbytes(size))
        )
    if kind == "finished":
        return pb.DeviceMessage(
            finished=pb.Finished(
                command_id=target,
                exit_code=rng.randrange(-(2**31), 2**31),
                signal=rng.randrange(-(2**31), 2**31),
                error=rng.choice(["", "\x00", "boom", "é" * 5000]),
                total_output_bytes=rng.choice([0, 3, 2**64 - 1]),
            )
        )
    if kind == "refused":
        return pb.DeviceMessage(
            refused=pb.Refused(
                command_id=target,
                reason=cast("pb.Refused.Reason.ValueType", rng.randrange(0, 10)),
                message=rng.choice(["", "\x00"]),
            )
        )
    if kind == "awaiting_approval":
        waiting = pb.AwaitingApproval(command_id=target, rule=rng.choice(["", "\x00x", "r" * 900]))
        waiting.deadline.seconds = rng.choice([0, -1, 2**40, 253402300800])
        return pb.DeviceMessage(awaiting_approval=waiting)
    return pb.DeviceMessage(heartbeat=pb.Heartbeat(seq=rng.randrange(2**64)))


# grpc's client, not the gateway: when a server ends a bidirectional call while the client
# is still writing, the client now and then reads this instead of the server's status. The
# gateway's own verdict is then checked in its log (a gateway error is logged "failed").
CLIENT_LOST_THE_STATUS = (grpc.StatusCode.INTERNAL, "Internal error from Core")


async def test_random_device_messages_never_break_the_gateway(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Seeded random messages, in bursts, over real gRPC: each stream either goes on
    (answering a heartbeat) or ends with a status naming the device's fault; never a
    gateway error, and the good device on the same replica is served throughout."""
    caplog.set_level(logging.WARNING, logger="controlplane.gateway")
    rng = random.Random(20261201)
    expected = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
    wrong = []
    async with connected(gateway, "good") as good:
        device = await paired(gateway, "fuzzed")
        for burst in range(25):
            await device.connect()
            try:
                command_id = await gateway.queue.submit("fuzzed", specs.Exec(["true"]))
                await device.next("command")
                for _ in range(rng.randrange(1, 6)):
                    await device.outgoing.put(_random_device_message(rng, command_id))
                await device.send(heartbeat=pb.Heartbeat(seq=1))
                answered = asyncio.ensure_future(device.next("heartbeat", timeout=10))
                ended = asyncio.ensure_future(device.ended(timeout=10))
                await asyncio.wait({answered, ended}, return_when=asyncio.FIRST_COMPLETED)
                for waiting in (answered, ended):
                    waiting.cancel()
                await asyncio.gather(answered, ended, return_exceptions=True)
                if not answered.done() or answered.cancelled() or answered.exception():
                    assert device.status is not None, f"burst {burst}: neither answered nor ended"
                verdict = (device.status, device.details)
                if verdict[0] not in {None, *expected} and verdict != CLIENT_LOST_THE_STATUS:
                    wrong.append(f"burst {burst}: {device.status} {device.details!r}")
            finally:
                await device.close()
            await good.send(heartbeat=pb.Heartbeat(seq=burst + 1))  # stays alive meanwhile
        await _round_trip(gateway, good, "good")
    assert not wrong, wrong
    gateway_errors = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert not gateway_errors, gateway_errors


# --- channel parsers, fuzzed -------------------------------------------------------------

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_DELETE = object()

# Any JSON value, including the strings that hurt: NUL, lone surrogates (valid JSON
# escapes, invalid UTF-8), huge numbers.
_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["\x00", "\ud800", "a\udfffb", "C0GENERAL", "1700000000.000100", "@_user_1"])
)
json_values = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _mutate(base: Any, path: tuple[Any, ...], replacement: Any) -> Any:
    """``base`` with the value at ``path`` replaced (or, for ``_DELETE``, removed)."""
    if not path:
        return replacement
    copy = json.loads(json.dumps(base))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    if replacement is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return copy


def mutations(base: Any) -> st.SearchStrategy[Any]:
    """``base`` with one to three of its values replaced by anything, or removed."""

    def apply(changes: list[tuple[int, Any]]) -> Any:
        value = base
        for index, replacement in changes:
            paths = _paths(value)
            value = _mutate(value, paths[index % len(paths)], replacement)
        return value

    change = st.tuples(st.integers(min_value=0, max_value=10_000), json_values | st.just(_DELETE))
    return st.lists(change, min_size=1, max_size=3).map(apply)


def assert_storable(trigger: IncomingTrigger) -> None:
    """Ingest either refuses ``trigger`` (InvalidInput) or can store every text of it."""
    try:
        intake_validate(trigger)
    except InvalidInput:
        return
    texts = [
        trigger.source,
        trigger.external_id,
        trigger.thread.external_id,
        trigger.thread.title or "",
        trigger.thread.url or "",
        trigger.actor.id,
        trigger.actor.name,
        trigger.kind,
        trigger.text,
        trigger.ack_ref or "",
        *trigger.actor.groups,
    ]
    for text in texts:
        assert "\x00" not in text
        text.encode()  # UnicodeEncodeError for a lone surrogate: Postgres would refuse it


SLACK_ME = SlackIdentity("U0AGENT", "B0AGENT", "T0TEAM")
SLACK_CALLBACK: dict[str, Any] = {
    "token": "legacy-verification-token",
    "team_id": "T0TEAM",
    "api_app_id": "A0APP",
    "event": {
        "user": "U0ALICE",
        "text": "<@U0AGENT> the tests are red",
        "ts": "1700000000.000100",
        "type": "app_mention",
        "channel": "C0GENERAL",
        "event_ts": "1700000000.000100",
        "team": "T0TEAM",
    },
    "type": "event_callback",
    "event_id": "Ev00000001",
    "event_time": 1700000000,
    "authorizations": [{"team_id": "T0TEAM", "user_id": "U0AGENT", "is_bot": True}],
    "is_ext_shared_channel": False,
}


def _slack_property(callback: Any) -> None:
    try:
        found = slack_events.parse(callback, SLACK_ME)
    except InvalidInput:
        return
    if isinstance(found, Ignored):
        return
    assert_storable(
        IncomingTrigger(
            source="slack",
            external_id=found.event_id,
            thread=ThreadRef(found.thread_external_id, title=found.text[:100] or None),
            actor=Actor(id=f"{found.team}/{found.user}", name=found.user or "bot"),
            kind=found.kind,
            text=found.text,
            ack_ref=found.ack_ref,
        )
    )
    json.dumps(callback)  # the payload the adapter stores


@FUZZ
@given(json_values)
def test_slack_parser_takes_any_json(callback: Any) -> None:
    _slack_property(callback)


@FUZZ
@given(mutations(SLACK_CALLBACK))
# What the fuzzing found, kept as fixed cases.
@example(_mutate(_mutate(SLACK_CALLBACK, ("team_id",), _DELETE), ("authorizations",), 5))
@example(_mutate(SLACK_CALLBACK, ("event", "text"), "\ud800"))
def test_slack_parser_takes_mutated_callbacks(callback: Any) -> None:
    _slack_property(callback)


LARK_EVENT: dict[str, Any] = {
    "schema": "2.0",
    "header": {
        "event_id": "ev-1",
        "token": "verification-token",
        "create_time": "1700000000000",
        "event_type": "im.message.receive_v1",
        "tenant_key": "736588c9260f175d",
        "app_id": "cli_app",
    },
    "event": {
        "sender": {
            "sender_id": {"union_id": "on_x", "user_id": "", "open_id": "ou_alice"},
            "sender_type": "user",
            "tenant_key": "736588c9260f175d",
        },
        "message": {
            "message_id": "om_1",
            "root_id": "",
            "parent_id": "",
            "create_time": "1700000000000",
            "chat_id": "oc_team",
            "chat_type": "group",
            "message_type": "text",
            "content": json.dumps({"text": "@_user_1 please fix the flaky build"}),
            "mentions": [
                {"key": "@_user_1", "id": {"open_id": "ou_bot"}, "name": "agent"},
            ],
        },
    },
}
_LARK_POST = json.dumps(
    {
        "title": "Build",
        "content": [[{"tag": "at", "user_id": "@_user_1"}, {"tag": "text", "text": " red"}]],
    }
)


def _lark_property(payload: Any) -> None:
    try:
        found = lark_events.parse(payload)
    except InvalidInput:
        return
    if isinstance(found, Ignored):
        return
    bot = LarkBot(open_id="ou_bot", name="agent")
    try:
        trigger = lark_events.to_trigger(
            found, direct=lark_events.addresses_bot(found, bot), sender_name=None
        )
    except InvalidInput:
        return
    assert_storable(trigger)


@FUZZ
@given(json_values.map(lambda value: {"schema": "2.0", "header": value}) | json_values)
def test_lark_parser_takes_any_json(payload: Any) -> None:
    if isinstance(payload, dict):
        _lark_property(payload)


@FUZZ
@given(
    mutations(LARK_EVENT)
    | mutations(_mutate(LARK_EVENT, ("event", "message", "content"), _LARK_POST)).map(
        lambda event: (
            _mutate(event, ("event", "message", "message_type"), "post")
            if isinstance(event, dict)
            and isinstance(event.get("event"), dict)
            and isinstance(event["event"].get("message"), dict)
            else event
        )
    )
    | json_values.map(
        lambda content: _mutate(LARK_EVENT, ("event", "message", "content"), json.dumps(content))
    )
    | st.text(alphabet='0123456789[]{}",:', max_size=5000).map(
        lambda content: _mutate(LARK_EVENT, ("event", "message", "content"), content)
    )
)
@example(_mutate(LARK_EVENT, ("event", "message", "mentions"), 7))
@example(_mutate(LARK_EVENT, ("event", "message", "content"), "1" * 5000))
@example(_mutate(LARK_EVENT, ("header", "event_id"), "\ud800"))
@example(
    _mutate(
        _mutate(LARK_EVENT, ("event", "message", "content"), json.dumps({"content": 5})),
        ("event", "message", "message_type"),
        "post",
    )
)
def test_lark_parser_takes_mutated_events(payload: Any) -> None:
    if isinstance(payload, dict):
        _lark_property(payload)


@FUZZ
@given(
    st.binary(max_size=300)
    | json_values.map(lambda value: json.dumps(value).encode())
    | json_values.map(lambda value: json.dumps({"encrypt": value}).encode())
    | st.binary(max_size=64).map(
        lambda data: json.dumps({"encrypt": base64.b64encode(data).decode()}).encode()
    )
)
def test_lark_callbacks_open_or_refuse_with_a_clear_error(body: bytes) -> None:
    for key in ("encrypt-key", None):
        try:
            opened = open_callback(
                body, {}, verification_token="verification-token", encrypt_key=key
            )
        except SuperagentError as exc:
            status = exc.http_status
        else:
            status = 200
            assert opened.event is None or isinstance(opened.event, dict)
        assert 200 <= status < 500


MATRIX_BOT = BotIdentity("@agent:example.org", "Agent")
MATRIX_EVENT: dict[str, Any] = {
    "type": "m.room.message",
    "sender": "@alice:example.org",
    "event_id": "$abc:example.org",
    "origin_server_ts": 1700000000000,
    "content": {
        "msgtype": "m.text",
        "body": "agent: the build is red",
        "m.mentions": {"user_ids": ["@agent:example.org"]},
        "formatted_body": '<a href="https://matrix.to/#/@agent:example.org">agent</a>',
        "m.relates_to": {"rel_type": "m.thread", "event_id": "$root:example.org"},
    },
    "unsigned": {"age": 10},
}


def _matrix_property(event: Any) -> None:
    if not isinstance(event, dict):
        return  # nio hands the loop dicts only
    events_seen = matrix_events.since_invited([event], MATRIX_BOT.user_id)
    assert events_seen in ([event], [])
    found = matrix_events.parse_message("!room:example.org", event, MATRIX_BOT)
    if found is None:
        return
    assert_storable(matrix_events.to_trigger(found, direct=found.mentions_bot, room_name="room"))


@FUZZ
@given(json_values)
def test_matrix_parser_takes_any_json(event: Any) -> None:
    _matrix_property(event)


@FUZZ
@given(mutations(MATRIX_EVENT))
@example(_mutate(MATRIX_EVENT, ("content", "body"), "\ud800"))
def test_matrix_parser_takes_mutated_events(event: Any) -> None:
    _matrix_property(event)


# --- channel receivers over their real transports ----------------------------------------

_SURROGATE = '"\\ud800"'  # a JSON escape that no UTF-8 text can hold


def _slack_bodies(good: dict[str, Any]) -> list[bytes]:
    """Signed but hostile Events API bodies."""
    event = good["event"]
    return [
        b"\xff\xfe not json",
        b"[1, 2, 3]",
        b"[" * 100_000 + b"]" * 100_000,
        json.dumps({**good, "event": 5}).encode(),
        json.dumps({**good, "event_id": "Ev-bad-auth", "team_id": None, "authorizations": 5})
        .replace('"team_id": null', '"x": 1')
        .encode(),
        json.dumps({**good, "event_id": "Ev-surrogate", "event": {**event, "text": "@"}})
        .replace('"text": "@"', f'"text": {_SURROGATE}')
        .encode(),
        json.dumps({**good, "event_id": "Ev-\x00"}).encode(),
        json.dumps({**good, "event_id": "Ev-big", "event": {**event, "ts": "1" * 5000}}).encode(),
    ]


async def test_hostile_slack_webhooks_get_4xx_and_the_next_event_counts(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await save_policy(
        db, Admission(sources={"slack": SourceAdmission(users=[slack_tests.ALICE_ID])})
    )
    with FakeSlack() as fake:
        fake.add_user(slack_tests.ALICE, "alice")
        fake.add_channel("C0GENERAL")
        adapter = SlackAdapter(slack_tests._settings(fake), Intake(pool))
        try:
            async with slack_tests._client(pool, adapter, adapter.settings) as client:
                good = fake.say("C0GENERAL", slack_tests.ALICE, f"<@{BOT_USER}> the tests are red")
                answers = []
                for body in _slack_bodies(good):
                    for retried in ({}, {"X-Slack-Retry-Num": "1"}):
                        answer = await slack_tests._post(client, None, raw=body, headers=retried)
                        answers.append((answer.status_code, body[:60], answer.text[:100]))
                assert [a for a in answers if a[0] >= 500] == []
                # Junk beside a well-formed message (authorizations: 5) is tolerated.
                stored = await pool.fetch("SELECT external_id FROM triggers")
                assert [row["external_id"] for row in stored] == ["Ev-bad-auth"]
                answer = await slack_tests._post(client, good)
                assert answer.status_code == 200, answer.text
                assert answer.json()["trigger"]["verdict"] == "explicit"
        finally:
            await adapter.close()


async def test_hostile_socket_mode_frames_are_dropped_and_the_next_envelope_counts(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await save_policy(
        db, Admission(sources={"slack": SourceAdmission(users=[slack_tests.ALICE_ID])})
    )
    with FakeSlack() as fake:
        fake.add_user(slack_tests.ALICE, "alice")
        fake.add_channel("C0GENERAL")
        settings = SlackSettings(
            bot_token=SecretStr(BOT_TOKEN), app_token=SecretStr(APP_TOKEN), api_url=fake.api_url
        )
        adapter = SlackAdapter(settings, Intake(pool))
        (service,) = adapter.services()
        await service.start()
        try:
            await assert_eventually(lambda: fake.open_sockets == 1, message="connected")
            for frame in ("not json", "[1]", "[" * 100_000, '{"type": 5}', '{"envelope_id": 5}'):
                fake.push_raw(frame)
            fake.push_raw(json.dumps({"envelope_id": "e-1", "type": "events_api", "payload": 7}))
            bad = fake.say("C0GENERAL", slack_tests.ALICE, "@")
            hostile = json.dumps(
                {"envelope_id": "e-2", "type": "events_api", "payload": bad}
            ).replace('"text": "@"', f'"text": {_SURROGATE}')
            fake.push_raw(hostile)
            await assert_eventually(lambda: "e-2" in fake.acks, message="malformed, acked")
            good = fake.say("C0GENERAL", slack_tests.ALICE, f"<@{BOT_USER}> deploy it")
            envelope = fake.push(good)
            await assert_eventually(lambda: envelope in fake.acks)
            assert await pool.fetchval("SELECT count(*) FROM triggers") == 1
            assert fake.open_sockets == 1  # the same connection all along
        finally:
            await service.stop(5)
            await adapter.close()
        assert service.task.done()
        assert service.task.exception() is None


def _lark_bad_events() -> list[dict[str, Any]]:
    make = lark_tests.message
    bad_mentions = make(event_id="ev-mentions")
    bad_mentions["event"]["message"]["mentions"] = 7
    big_number = make(event_id="ev-number")
    big_number["event"]["message"]["content"] = "1" * 5000
    post = make(event_id="ev-post")
    post["event"]["message"].update(message_type="post", content=json.dumps({"content": 5}))
    no_header = make(event_id="ev-header")
    no_header["header"] = {"token": lark_tests.TOKEN, "event_type": "im.message.receive_v1"}
    return [bad_mentions, big_number, post, no_header]


def _lark_surrogate_body() -> bytes:
    return (
        json.dumps(lark_tests.message(event_id="ev-surrogate", text="@"))
        .replace('{\\"text\\": \\"@\\"}', '{\\"text\\": \\"\\\\ud800\\"}')
        .encode()
    )


async def test_hostile_lark_callbacks_get_4xx_and_the_next_event_counts(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await save_policy(db, Admission(sources={"lark": SourceAdmission(users=[lark_tests.ALICE])}))
    with FakeLark() as fake:
        for key in (lark_tests.KEY, None):
            adapter = LarkAdapter(lark_tests._settings(fake, key=key), Intake(pool))
            try:
                async with lark_tests._client(pool, adapter) as client:
                    answers = []
                    for event in _lark_bad_events():
                        answer = await lark_tests.deliver(client, event, key=key)
                        answers.append((answer.status_code, answer.text[:100]))
                    raw = _lark_surrogate_body()
                    if key:
                        raw = json.dumps({"encrypt": lark_encrypt(key, raw)}).encode()
                    answer = await lark_tests.deliver(client, None, key=key, raw=raw)
                    answers.append((answer.status_code, answer.text[:100]))
                    for garbage in (b"\xff", b"[]", b'{"encrypt": 5}', b'{"encrypt": "AAAA"}'):
                        answer = await lark_tests.deliver(client, None, key=key, raw=garbage)
                        answers.append((answer.status_code, answer.text[:100]))
                    # 4xx, or 200 where the junk was beside a well-formed message.
                    assert [a for a in answers if a[0] >= 500] == [], answers
                    good = lark_tests.message(
                        event_id=f"ev-good-{key}", chat_type="p2p", text="deploy", mentions=[]
                    )
                    answer = await lark_tests.deliver(client, good, key=key)
                    assert answer.status_code == 200, answer.text
                    assert "trigger" in answer.json()
            finally:
                await adapter.close()
        stored = await pool.fetch("SELECT external_id FROM triggers WHERE source = 'lark'")
        assert {"ev-good-None", f"ev-good-{lark_tests.KEY}"} <= {r["external_id"] for r in stored}
        assert "ev-header" not in {r["external_id"] for r in stored}


async def test_hostile_lark_long_connection_frames_and_events(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await save_policy(db, Admission(sources={"lark": SourceAdmission(users=[lark_tests.ALICE])}))
    with FakeLark() as fake:
        adapter = LarkAdapter(lark_tests._settings(fake, long_connection=True), Intake(pool))
        [service] = adapter.services()
        await service.start()
        try:
            await assert_eventually(lambda: fake.ws_connected, message="the client connects")
            for event in _lark_bad_events():
                answer = await asyncio.wait_for(asyncio.wrap_future(fake.push_event(event)), 10)
                assert answer["code"] == 200, (event["header"], answer)  # dropped, not retried
            for garbage in (b"", b"\xff\xff\xff", b"\x08\x01\x10\x01"):
                fake.push_raw(garbage)
            await assert_eventually(lambda: fake.ws_connected, message="connected again")
            good = lark_tests.message(
                event_id="ev-ws-good", chat_type="p2p", text="deploy", mentions=[]
            )
            answer = await asyncio.wait_for(asyncio.wrap_future(fake.push_event(good)), 10)
            assert answer["code"] == 200
            stored = await pool.fetchval(
                "SELECT count(*) FROM triggers WHERE external_id = 'ev-ws-good'"
            )
            assert stored == 1
        finally:
            await service.stop()
            await adapter.close()
        assert service.task.done()
        assert service.task.exception() is None


class FakeHomeserver(LoopbackFake):
    """Just enough of a homeserver for the sync loop: scripted /sync bodies, raw bytes."""

    def __init__(self, syncs: list[bytes]) -> None:
        self.syncs = syncs
        self.served = 0
        self._http = LoopbackServer(
            Starlette(routes=[Route("/{path:path}", self._any, methods=["GET", "POST", "PUT"])]),
            name="FakeHomeserver",
        )

    async def _any(self, request: Request) -> Response:
        path = request.url.path
        if path.endswith("/displayname"):
            return JSONResponse({"displayname": "Agent"})
        if path.endswith("/sync"):
            if self.served < len(self.syncs):
                body = self.syncs[self.served]
                self.served += 1
                return Response(body, media_type="application/json")
            await asyncio.sleep(0.2)  # a long poll with nothing new
            return JSONResponse({"next_batch": f"s{self.served}", "rooms": {}})
        return JSONResponse({"errcode": "M_UNRECOGNIZED", "error": path}, status_code=404)


def _sync_body(batch: str, events: list[dict[str, Any]]) -> bytes:
    room = {
        "timeline": {"events": events, "limited": False, "prev_batch": "p0"},
        "state": {"events": []},
        "summary": {"m.joined_member_count": 2},
    }
    body = {"next_batch": batch, "rooms": {"join": {"!room:example.org": room}}}
    return json.dumps(body).replace("SURROGATE", "\\ud800").encode()


def _matrix_message(event_id: str, body: str, **more: Any) -> dict[str, Any]:
    return {
        "type": "m.room.message",
        "sender": "@alice:example.org",
        "event_id": event_id,
        "origin_server_ts": 1700000000000,
        "content": {"msgtype": "m.text", "body": body},
        **more,
    }


async def test_a_malformed_matrix_event_is_skipped_and_the_sync_goes_on(
    pool: asyncpg.Pool,
) -> None:
    hostile = [
        _matrix_message("$surrogate:example.org", "SURROGATE"),
        _matrix_message("$nul\u0000:example.org", "hi"),
        _matrix_message("$long:example.org", "hi", sender="@" + "a" * 300 + ":example.org"),
        {"type": "m.room.message", "sender": 5, "event_id": [], "content": "no"},
        {"type": "m.room.message", "content": {"body": {"not": "text"}}},
        _matrix_message("$good:example.org", "agent: the build is red"),
    ]
    syncs = [
        _sync_body("s1", []),
        b"<html>502 Bad Gateway</html>",  # a proxy's page: retried with backoff
        b'{"next_batch": 5, "rooms": []}',  # not a /sync body at all
        _sync_body("s2", hostile),
    ]
    with FakeHomeserver(syncs) as homeserver:
        settings = MatrixSettings(
            homeserver=homeserver._http.url,
            user_id="@agent:example.org",
            access_token=SecretStr("token"),
            sync_timeout_seconds=1,
        )
        service = MatrixSync(MatrixAccount(settings), Intake(pool), pool)
        await service.start()
        try:
            await assert_eventually(
                lambda: pool.fetchval(
                    "SELECT count(*) FROM triggers WHERE external_id = '$good:example.org'"
                ),
                message="the good event after the bad ones is ingested",
            )
            await assert_eventually(lambda: homeserver.served == len(syncs))
            assert await pool.fetchval("SELECT count(*) FROM triggers") == 1
            assert not service.task.done()
        finally:
            await service.stop(5)
