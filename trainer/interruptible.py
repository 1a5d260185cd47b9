"""Stopping code that never polls: `stops_on_request(should_stop)` around a call such as transformers'
`from_pretrained`, which reads shard after shard without asking anyone whether to go on.

A watcher thread asks `should_stop` twice a second; when it says stop, the thread that runs the block receives
`LoadInterrupted` at its next Python instruction (CPython's PyThreadState_SetAsyncExc). A loader spends its time in
Python between tensors, so a cancelled job's load ends within seconds, whatever shard it is on; a single C call
(one tensor's copy) finishes first. The pending exception is withdrawn if the block ends before it lands.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from trainer.errors import StageInterrupted

POLL_SECONDS = 0.5


class LoadInterrupted(StageInterrupted):
    """Raised inside a loader by the watcher: CPython instantiates it without arguments."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or ("the target's load stopped on request (the job was cancelled or handed over); "
                                    "nothing of it was kept",)))


def _raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exception) if exception else None)


@contextmanager
def stops_on_request(should_stop: Callable[[], bool] | None, poll_seconds: float = POLL_SECONDS) -> Iterator[None]:
    """Run the block on this thread; end it with LoadInterrupted once `should_stop()` is true."""
    if should_stop is None:
        yield
        return
    target_thread, lock = threading.get_ident(), threading.Lock()
    done, state = threading.Event(), {"active": True, "fired": False}

    def watch() -> None:
        while not done.wait(poll_seconds):
            if should_stop():
                with lock:
                    if state["active"]:
                        state["fired"] = True
                        _raise_in(target_thread, LoadInterrupted)
                return

    watcher = threading.Thread(target=watch, name="stops-on-request", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            state["active"] = False
            fired = state["fired"]
        done.set()
        watcher.join()
        if fired:
            _raise_in(target_thread, None)  # withdraw it if it has not landed yet (the block ended first)
