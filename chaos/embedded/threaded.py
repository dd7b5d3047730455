"""An aiohttp server run on a daemon thread with its own event loop.

The emulated control plane's servers (Kubernetes API, SageMaker endpoint) are started
from synchronous code — pytest fixtures, the embedded cluster — so each needs the same
start-on-a-thread / stop-from-any-thread lifecycle; this is it, once.
"""

from __future__ import annotations

import abc
import asyncio
import threading


class ThreadedServer(abc.ABC):
    """Subclasses define ``start_async``/``stop_async``; ``start()`` returns once listening."""

    thread_name = "server"
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @abc.abstractmethod
    async def start_async(self) -> None: ...

    @abc.abstractmethod
    async def stop_async(self) -> None: ...

    def start(self):
        """Serve on a daemon thread with its own event loop; a failure to start is raised here."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as err:  # reported by start()
                failure.append(err)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop_async())
            loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
