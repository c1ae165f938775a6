"""The audit trail of model management: whether its APIs answer at all (--management), and one
line and one metric per action, naming who (the key or access key the door accepted), from
where, what and how it ended.

The doors' checks set `caller` for the request they let in (a context variable, so the
endpoint that runs for that request sees it); each door wraps its management endpoints once
with a ManagementGate."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar

from tfservo.core.settings import Settings

__all__ = ["ManagementGate", "caller"]

log = logging.getLogger("tfservo.audit")

caller: ContextVar[str] = ContextVar("tfservo_caller", default="-")


class ManagementGate:
    """Whether this server answers its model-management APIs, and the record of each action."""

    def __init__(self, settings: Settings, on_action: Callable[[str, str], None] = lambda door, outcome: None) -> None:
        self.open, self.reason = settings.management_open()
        self.on_action = on_action  # (door, outcome): the metric

    @property
    def off_message(self) -> str:
        """What a management request is told while the APIs are off: why, and how to turn them on."""
        return (f"model management is off on this server ({self.reason}); start it with --api-keys FILE and "
                "use a key with scope manage, or with --management on")

    def describe(self) -> str:
        """The start-up line's part about management."""
        if self.open:
            return f"model management on ({self.reason})"
        return f"model management off ({self.reason}; --management on or --api-keys turns it on)"

    def record(self, door: str, peer: str, action: str, model: str | None, outcome: str) -> None:
        """One management action: an audit line and the metric."""
        log.info("manage peer=%s who=%s %s %s model=%s outcome=%s", peer, caller.get(), door, action,
                 model or "-", outcome)
        self.on_action(door, outcome)
