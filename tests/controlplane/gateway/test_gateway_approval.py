"""A command the device holds for local approval, as the control plane sees it.

The real gateway on a real Postgres; a scripted device sends AwaitingApproval the way
endpointd does (after Accepted, when its local policy says `ask`), then the human's answer
shows up as the next Accepted, output and Finished, or as a Refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.gateway import devices, specs
from controlplane.gateway.queue import CommandResult
from superagent_proto.v1 import endpoint_pb2 as pb
from tests.support.gateway_harness import FakeDevice, Gateway, connected, running_gateway
from tests.support.helpers import assert_eventually

RULE = 'ask: ["git", "push", "*"]'


@pytest.fixture
async def gateway(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Gateway]:
    async with running_gateway(database_url, db, tmp_path) as gw:
        yield gw


def _deadline(seconds: int = 300) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)


def _awaiting(command_id: str, deadline: datetime) -> pb.AwaitingApproval:
    message = pb.AwaitingApproval(command_id=command_id, rule=RULE)
    message.deadline.FromDatetime(deadline)
    return message


async def _state(gateway: Gateway, command_id: str) -> CommandResult:
    return await gateway.queue.result(command_id)


async def _in_state(gateway: Gateway, command_id: str, state: str) -> CommandResult:
    result = await assert_eventually(
        lambda: _has_state(gateway, command_id, state), message=f"{command_id} not {state}"
    )
    assert isinstance(result, CommandResult)
    return result


async def _has_state(gateway: Gateway, command_id: str, state: str) -> CommandResult | None:
    result = await _state(gateway, command_id)
    return result if result.state == state else None


async def _queue_depth(gateway: Gateway, name: str) -> int:
    (view,) = [d for d in await devices.list_devices(gateway.pool) if d.name == name]
    return view.queue_depth


async def test_an_approved_command_waits_visibly_then_runs_and_finishes(gateway: Gateway) -> None:
    async with connected(gateway) as device:
        command_id = await gateway.queue.submit("laptop", specs.Exec(["git", "push"]))
        await device.next("command")
        deadline = _deadline()
        # Back to back, as the daemon sends them: the Accepted must not land after the wait.
        await device.send(accepted=pb.Accepted(command_id=command_id))
        await device.send(awaiting_approval=_awaiting(command_id, deadline))
        waiting = await _in_state(gateway, command_id, "awaiting_approval")
        assert waiting.approval_rule == RULE
        assert waiting.approval_deadline == deadline
        assert not waiting.done
        assert await _queue_depth(gateway, "laptop") == 1
        # A worker waiting for the result sees what holds it up.
        seen = await gateway.queue.wait(command_id, timeout=0.2)
        assert (seen.state, seen.approval_rule) == ("awaiting_approval", RULE)

        # Approved on the device: Accepted again as it starts, then the usual.
        await device.send(accepted=pb.Accepted(command_id=command_id))
        await _in_state(gateway, command_id, "running")
        body = b"pushed\n"
        await device.send(output=pb.OutputChunk(command_id=command_id, offset=0, data=body))
        await device.send(
            finished=pb.Finished(command_id=command_id, exit_code=0, total_output_bytes=len(body))
        )
        result = await gateway.queue.wait(command_id, timeout=10)
        assert result.ok
        assert result.approval_rule == RULE  # kept: it explains the delay afterwards
        assert result.approval_deadline == deadline
        assert await gateway.queue.output(command_id) == body
        assert await _queue_depth(gateway, "laptop") == 0


async def test_output_alone_moves_a_waiting_command_on(gateway: Gateway) -> None:
    async with connected(gateway) as device:
        command_id = await gateway.queue.submit("laptop", specs.Exec(["make"]))
        await device.next("command")
        await device.send(accepted=pb.Accepted(command_id=command_id))
        await device.send(awaiting_approval=_awaiting(command_id, _deadline()))
        await _in_state(gateway, command_id, "awaiting_approval")
        # The second Accepted was lost: output says it runs all the same.
        await device.send(output=pb.OutputChunk(command_id=command_id, offset=0, data=b"cc\n"))
        await _in_state(gateway, command_id, "running")
        # A stale AwaitingApproval does not take it back.
        await device.send(awaiting_approval=_awaiting(command_id, _deadline()))
        await device.send(finished=pb.Finished(command_id=command_id, total_output_bytes=3))
        result = await gateway.queue.wait(command_id, timeout=10)
        assert result.state == "finished"


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (pb.Refused.REASON_APPROVAL_DENIED, "approval_denied"),
        (pb.Refused.REASON_APPROVAL_TIMEOUT, "approval_timeout"),
    ],
)
async def test_a_denied_or_unanswered_approval_ends_refused(
    gateway: Gateway, reason: pb.Refused.Reason.ValueType, expected: str
) -> None:
    async with connected(gateway) as device:
        command_id = await gateway.queue.submit("laptop", specs.Exec(["rm", "-rf", "build"]))
        await device.next("command")
        await device.send(accepted=pb.Accepted(command_id=command_id))
        await device.send(awaiting_approval=_awaiting(command_id, _deadline(5)))
        await _in_state(gateway, command_id, "awaiting_approval")
        await device.send(
            refused=pb.Refused(command_id=command_id, reason=reason, message=f"rule {RULE}")
        )
        result = await gateway.queue.wait(command_id, timeout=10)
        assert (result.state, result.refusal_reason) == ("refused", expected)
        assert result.error == f"rule {RULE}"
        ack = await device.next("ack")
        while not ack.ack.finished:
            ack = await device.next("ack")
        assert ack.ack.command_id == command_id
        # A late repeat of the wait changes nothing once the command is final.
        await device.send(awaiting_approval=_awaiting(command_id, _deadline()))
        await device.send(heartbeat=pb.Heartbeat(seq=1))
        await device.next("heartbeat")
        assert (await _state(gateway, command_id)).state == "refused"


async def test_a_reconnect_takes_the_devices_word_for_what_waits_and_what_runs(
    gateway: Gateway,
) -> None:
    device = FakeDevice(gateway)
    await device.pair(await gateway.pairing_code("laptop"))
    await device.connect()
    waits = await gateway.queue.submit("laptop", specs.Exec(["deploy"]))
    runs = await gateway.queue.submit("laptop", specs.Exec(["test"]))
    for _ in range(2):
        await device.next("command")
    # The device accepted both and held both for approval, and then lost its stream before
    # saying so; meanwhile the second was approved and started.
    await device.send(accepted=pb.Accepted(command_id=waits))
    await device.send(accepted=pb.Accepted(command_id=runs))
    await device.send(awaiting_approval=_awaiting(runs, _deadline()))
    await _in_state(gateway, waits, "running")
    await _in_state(gateway, runs, "awaiting_approval")
    await device.close()

    await device.connect(
        in_flight=[
            pb.InFlight(command_id=waits, state=pb.InFlight.STATE_AWAITING_APPROVAL),
            pb.InFlight(command_id=runs, state=pb.InFlight.STATE_RUNNING),
        ]
    )
    try:
        await _in_state(gateway, waits, "awaiting_approval")
        await _in_state(gateway, runs, "running")
        # The device resends its AwaitingApproval after the Hello: the rule appears.
        await device.send(awaiting_approval=_awaiting(waits, _deadline()))
        await assert_eventually(
            lambda: _rule_is(gateway, waits, RULE), message="rule not recorded on resend"
        )
    finally:
        await device.close()


async def _rule_is(gateway: Gateway, command_id: str, rule: str) -> bool:
    return (await _state(gateway, command_id)).approval_rule == rule


async def test_an_awaiting_approval_for_an_unknown_command_is_ignored(gateway: Gateway) -> None:
    async with connected(gateway) as device:
        await device.send(awaiting_approval=_awaiting("cmd_unknown", _deadline()))
        # The stream stays up and answers.
        await device.send(heartbeat=pb.Heartbeat(seq=1))
        await device.next("heartbeat")
        command_id = await gateway.queue.submit("laptop", specs.Exec(["true"]))
        assert (await device.next("command")).command.command_id == command_id
