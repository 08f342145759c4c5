"""What a check says about a command: a :class:`Decision` naming the rule that decided, and
the :class:`Refusal` sent when the answer is no."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from endpointd.rules.terms import Action
from superagent_shared.messages import Reason


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    message: str


@dataclass(frozen=True)
class Decision:
    """What the policy says about one command, and which rule said it.

    ``rule`` is the rule's name as the policy file spells it (``allowed_roots``,
    ``denied_paths: ~/.ssh``, ``commands[2] "git push*"``, ``credentials.NAME.allow``,
    ``default_action``, ``policy.toml`` when the file itself is broken); ``message`` is one
    line for the control plane and the audit log that names the rule. Neither ever contains
    a secret value.
    """

    action: Action
    rule: str
    message: str
    # The Refused reason when action is "deny".
    reason: Reason = Reason.POLICY_DENIED

    @property
    def refusal(self) -> Refusal | None:
        """None only for ``allow``.

        ``deny`` gives the refusal to send. ``ask`` gives the refusal for a human's "no"
        (REASON_APPROVAL_DENIED), so code that does not handle ``ask`` fails closed; a
        daemon that holds the command uses :meth:`approval_refusal` once it knows the
        outcome.
        """
        if self.action == "allow":
            return None
        if self.action == "ask":
            return self.approval_refusal("denied")
        return Refusal(self.reason, self.message)

    def approval_refusal(self, outcome: Literal["denied", "timeout"]) -> Refusal:
        """The refusal for an ``ask`` that a human denied or nobody answered in time."""
        if outcome == "timeout":
            return Refusal(
                Reason.APPROVAL_TIMEOUT,
                f"nobody approved it on the device in time ({self.rule} asks for approval)",
            )
        return Refusal(
            Reason.APPROVAL_DENIED,
            f"denied by the user on the device ({self.rule} asks for approval)",
        )
