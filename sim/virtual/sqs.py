"""The START queue in memory, at the boto3 client's API, with the stack's dead-letter rule.

A standard queue: a received message is invisible for the visibility timeout (the
stack's: twice the lease), a change of visibility or a delete answers to its receipt
handle, and a message received :data:`wsfleet.schema.MAX_HINT_RECEIVES` times is moved
to the dead-letter queue at its next receive, as SQS's redrive policy does. A long poll
waits in virtual time: :meth:`Queue.wait` returns when a message may be visible, so a
message sent wakes one waiting poller, not all of them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from wsfleet import schema


@dataclass
class Message:
    id: str
    body: str
    sent_ms: int
    attributes: dict
    receives: int = 0
    visible_at: float = 0.0
    handle: str = ""


class Queue:
    def __init__(self, *, now: Callable[[], float], wall_ms: Callable[[], int], visibility_s: float,
                 max_receives: int = schema.MAX_HINT_RECEIVES) -> None:
        self._now, self._wall_ms = now, wall_ms
        self.visibility_s, self.max_receives = visibility_s, max_receives
        self.messages: dict[str, Message] = {}
        self._visible: list[tuple[float, int, str]] = []  # (visible_at, order, id): may hold stale entries
        self._order = itertools.count()
        self._ids = itertools.count()
        self._waiters: deque[asyncio.Future] = deque()
        self.dead: list[Message] = []
        self.sent = self.received = self.deleted = 0

    # --- the client's calls -----------------------------------------------------------------

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:
        for entry in Entries:
            self._send(entry["MessageBody"], entry.get("MessageAttributes", {}))
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    def send_message(self, *, QueueUrl: str, MessageBody: str, **extra: Any) -> dict:
        return {"MessageId": self._send(MessageBody, extra.get("MessageAttributes", {}))}

    def _send(self, body: str, attributes: dict) -> str:
        mid = f"m{next(self._ids)}"
        self.messages[mid] = Message(mid, body, self._wall_ms(), attributes, visible_at=self._now())
        self._make_visible(mid)
        self.sent += 1
        return mid

    def receive_message(self, *, QueueUrl: str, MaxNumberOfMessages: int = 1, **_: Any) -> dict:
        out, now = [], self._now()
        while self._visible and len(out) < MaxNumberOfMessages and self._visible[0][0] <= now:
            at, _, mid = heapq.heappop(self._visible)
            msg = self.messages.get(mid)
            if msg is None or msg.visible_at != at:
                continue  # deleted, or its visibility changed since
            if msg.receives >= self.max_receives:
                del self.messages[mid]
                self.dead.append(msg)
                continue
            msg.receives += 1
            msg.handle = f"{mid}/{msg.receives}"
            msg.visible_at = now + self.visibility_s
            self._make_visible(mid, wake=False)
            self.received += 1
            out.append({
                "MessageId": mid,
                "ReceiptHandle": msg.handle,
                "Body": msg.body,
                "Attributes": {"ApproximateReceiveCount": str(msg.receives), "SentTimestamp": str(msg.sent_ms)},
            })
        if out and self._visible and self._visible[0][0] <= now:
            self._wake()  # more for the next poller
        return {"Messages": out} if out else {}

    def change_message_visibility(self, *, QueueUrl: str, ReceiptHandle: str, VisibilityTimeout: int) -> dict:
        msg = self.messages.get(ReceiptHandle.partition("/")[0])
        if msg is not None and msg.handle == ReceiptHandle:
            msg.visible_at = self._now() + VisibilityTimeout
            self._make_visible(msg.id)
        return {}

    def change_message_visibility_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:
        for e in Entries:
            self.change_message_visibility(QueueUrl=QueueUrl, ReceiptHandle=e["ReceiptHandle"], VisibilityTimeout=e["VisibilityTimeout"])
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> dict:
        if self.messages.pop(ReceiptHandle.partition("/")[0], None) is not None:
            self.deleted += 1
        return {}

    def delete_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:
        for e in Entries:
            self.delete_message(QueueUrl=QueueUrl, ReceiptHandle=e["ReceiptHandle"])
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    # --- waiting ------------------------------------------------------------------------------

    def _make_visible(self, mid: str, *, wake: bool = True) -> None:
        msg = self.messages[mid]
        heapq.heappush(self._visible, (msg.visible_at, next(self._order), mid))
        delay = msg.visible_at - self._now()
        if delay <= 0:
            if wake:
                self._wake()
        else:
            asyncio.get_running_loop().call_later(delay, self._wake)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def wait(self, timeout: float) -> None:
        """Until a message may be visible (this poller is woken first in line), or ``timeout``."""
        if self._visible and self._visible[0][0] <= self._now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass

    def depth(self) -> int:
        return len(self.messages)
