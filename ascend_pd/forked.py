"""Run a few independent CPU-bound calls at once, each in a process forked for it, and collect their
results (pickled back through a pipe).

For work that is single-threaded Python all through (the program under Pulumi's mocks): threads
would share one interpreter lock, and a pool of spawned workers would import everything again.
A fork starts from this process as it is (imports, patches, config) and costs milliseconds.

`run_all` never raises for a child: a call that failed in its child (an exception, a result that
does not pickle, a child killed) is left out of the answer, so that the caller runs it again in its
own process, where its error is raised with its real traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
from typing import Any, BinaryIO, Callable, Hashable


def run_all(calls: dict[Hashable, tuple[Callable[..., Any], tuple]]) -> dict[Hashable, Any]:
    """key -> (function, args): key -> its result, for each call that succeeded in its child."""
    pending: dict[Hashable, tuple[int, BinaryIO]] = {}
    results: dict[Hashable, Any] = {}
    try:
        for key, (fn, args) in calls.items():
            pid, fd = _start(fn, args)
            pending[key] = (pid, os.fdopen(fd, "rb"))
        for key in list(pending):
            pid, pipe = pending[key]
            try:  # streamed, as the child writes it: no second copy of the whole answer in memory
                result, ok = pickle.load(pipe), True
            except Exception:  # noqa: BLE001 - a child that failed or died mid-answer: the caller runs it
                result, ok = None, False
            _, status = os.waitpid(pid, 0)
            pipe.close()
            del pending[key]
            if ok and os.waitstatus_to_exitcode(status) == 0:
                results[key] = result
    finally:
        for pid, pipe in pending.values():  # interrupted (Ctrl-C): no child outlives the caller
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            pipe.close()
    return results


def _start(fn: Callable[..., Any], args: tuple) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    # The child: answers through the pipe and leaves with os._exit, running none of the parent's exit
    # handlers (pytest's, the CLI's) and flushing none of its buffers twice.
    code = 1
    try:
        os.close(read)
        # A loop of its own: the parent's loop (if any) shares its epoll descriptor with this process.
        asyncio.set_event_loop(asyncio.new_event_loop())
        result = fn(*args)
        with os.fdopen(write, "wb") as pipe:
            pickle.dump(result, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        code = 0
    except BaseException:  # noqa: BLE001 - reported as a failure: the parent runs the call itself
        pass
    finally:
        os._exit(code)
