"""One database poll per job for all of a process's SSE streams on it.

A dashboard with fifty viewers of one job used to mean fifty pollers, each asking the database every
poll interval for the same events. Here each job with open streams has one `JobFeed`: a task that polls
the job's status and new events once per interval and keeps the most recent ones in a window. A stream
takes its events from that window; only a stream that is further behind than the window (a reconnect
with an old Last-Event-ID) reads the database itself, until it has caught up. An idle stream therefore
costs no query and holds no connection; the feed's poll holds one for the duration of one query.

Ordering is what `domain/events.py` guarantees: events become visible in sequence order, so "everything
after seq N" read at any moment has no gaps, and the window is always a contiguous run of sequence
numbers ending at the feed's `last_seq`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable

from api.schemas import EventOut
from domain.states import TERMINAL_STATUSES, JobStatus

WINDOW = 500  # events kept per job: a stream less than this far behind never queries


class JobFeed:
    def __init__(self, poll: Callable[[int], object], interval: float, start_seq: int) -> None:
        self._poll = poll  # async (after_seq) -> (status, events)
        self.interval = interval
        self.window: deque[EventOut] = deque(maxlen=WINDOW)
        self.last_seq = start_seq  # every event up to here has been seen (window or earlier)
        self.status: str | None = None
        self.subscribers = 0
        self._changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def window_start(self) -> int:
        """The lowest sequence number a stream can take from the window (last_seq + 1 when it is empty)."""
        return self.window[0].id if self.window else self.last_seq + 1

    def terminal(self) -> bool:
        return self.status is not None and JobStatus(self.status) in TERMINAL_STATUSES

    async def run(self) -> None:
        try:
            while self.subscribers:
                status, events = await self._poll(self.last_seq)  # type: ignore[misc]
                self.status = status
                if events:
                    self.window.extend(events)
                    self.last_seq = events[-1].id
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()
                if self.terminal() and len(events) < WINDOW:
                    return  # nothing more will come; streams finish from the window
                if len(events) < WINDOW:
                    await asyncio.sleep(self.interval)
        except Exception as exc:  # the streams see it and end; the next stream starts a fresh feed
            self.error = exc
            self._changed.set()

    async def wait(self, timeout: float) -> None:
        """Until the next poll has been taken in (or `timeout`)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class EventFeeds:
    """The feeds of one process (one event loop), by job id."""

    def __init__(self, poll: Callable[[str, int], object], interval: float) -> None:
        self._poll = poll
        self.interval = interval
        self._feeds: dict[str, JobFeed] = {}

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str, start_seq: int) -> AsyncIterator[JobFeed]:
        feed = self._feeds.get(job_id)
        loop = asyncio.get_running_loop()
        # A finished feed, or one left on another event loop (a test client that has closed), is replaced.
        if feed is None or feed.task is None or feed.task.done() or feed.task.get_loop() is not loop:
            feed = JobFeed(lambda after: self._poll(job_id, after), self.interval, start_seq)  # type: ignore[arg-type]
            self._feeds[job_id] = feed
        feed.subscribers += 1
        if feed.task is None:
            feed.task = loop.create_task(feed.run())
        try:
            yield feed
        finally:
            feed.subscribers -= 1
            if not feed.subscribers:
                if self._feeds.get(job_id) is feed:
                    del self._feeds[job_id]
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feed.task
