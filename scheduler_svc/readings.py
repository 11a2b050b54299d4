"""The bridge from the ledgers to Prometheus: every ledger read at one moment, on the engine's
event loop, so that a scrape (from the metrics endpoint's own thread) never sees half a step.

The counters of lost workers' ledgers are kept (`RetiredLedgers`), so an exported counter never
goes down when a worker goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from scheduler_svc.metrics import LedgerReading, RetiredLedgers
from scheduler_svc.worker_link import WorkerLink


class LedgerReadings:
    def __init__(self, links: Callable[[], Iterable[WorkerLink]]) -> None:
        self._links = links
        self.retired = RetiredLedgers()
        self.loop: asyncio.AbstractEventLoop | None = None  # the engine's, once a worker came

    def retire(self, link: WorkerLink) -> None:
        """A lost worker's drained ledger: its counters (its worker_lost releases among them)
        stay exported."""
        self.retired.retire(link.model, link.worker_id, link.scheduler.snapshot())

    def __call__(self) -> list[LedgerReading]:
        loop = self.loop
        if loop is None or not loop.is_running() or _on_loop(loop):
            return self._take()

        async def on_loop() -> list[LedgerReading]:
            return self._take()

        return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=5)

    def _take(self) -> list[LedgerReading]:
        return self.retired.readings(
            (lk.model, lk.worker_id, lk.scheduler.snapshot()) for lk in list(self._links())
        )


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
