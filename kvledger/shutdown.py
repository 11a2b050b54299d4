"""Stopping a service within a deadline, whatever signals arrive and however often.

The first SIGTERM or SIGINT asks the service to stop cleanly (its `on_stop`), and arms a
watchdog: a service still alive `timeout` seconds later exits anyway, saying so. Later signals
change nothing, they only log. Stopping this way, rather than raising SystemExit from the
handler, matters for a process with threads: a second SystemExit raised while the interpreter
joins its threads (`threading._shutdown`) is swallowed there, and a thread that keeps running
(a reconnecting link) then keeps the process alive after its parent reported it stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopper:
    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        self.requested = threading.Event()
        self._on_stop: Callable[[], None] | None = None

    def install(self) -> Stopper:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def on_stop(self, action: Callable[[], None]) -> None:
        """What a stop request runs; runs it now when a stop was already requested."""
        self._on_stop = action
        if self.requested.is_set():
            action()

    def _handle(self, signum: int, _frame: object) -> None:
        if self.requested.is_set():
            log.info("%s: %s again; already stopping", self.name, signal.Signals(signum).name)
            return
        log.info("%s stopping (%s)", self.name, signal.Signals(signum).name)
        self.requested.set()
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()
        if self._on_stop is not None:
            self._on_stop()
        else:  # nothing to wind down yet (still loading): leave the main thread now
            raise SystemExit(0)

    def _watchdog(self) -> None:
        if self.timeout > 0:
            threading.Event().wait(self.timeout)
        log.warning(
            "%s still running %g s after the stop request (--shutdown-timeout); exiting now",
            self.name,
            self.timeout,
        )
        logging.shutdown()
        os._exit(0)
