"""The frontend's uvicorn server, stopping the way every kvledger service stops.

uvicorn takes a second SIGINT as "force quit": it stops waiting for open responses and cuts
them mid-stream. Ctrl-C reaches every process of a terminal's group, so a user pressing it
twice would cut the very streams the scheduler was about to end with an error event. Here
the first SIGTERM or SIGINT starts the graceful shutdown, bounded by --shutdown-timeout
(uvicorn's `timeout_graceful_shutdown`), and later signals only log, as kvledger/shutdown.py
does for the other services.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from types import FrameType

import uvicorn

log = logging.getLogger(__name__)


class FrontendServer(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            log.info("frontend: %s again; already stopping", signal.Signals(sig).name)
            return
        log.info("frontend stopping (%s)", signal.Signals(sig).name)
        super().handle_exit(sig, frame)


def serve(config: uvicorn.Config) -> None:
    """Run the server until it stops; exit 3 (uvicorn's startup failure) if it never
    started, e.g. the port is taken."""
    config.load_app()
    server = FrontendServer(config)
    # uvicorn re-raises the SIGINT it captured once it has stopped
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(3)
