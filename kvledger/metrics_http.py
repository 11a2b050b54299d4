"""The Prometheus endpoint every service runs beside its work, with a connection timeout.

prometheus_client's server gives each connection a thread of the serving process (a worker's
is the model's) and waits on it forever: 300 clients that connect and send nothing held 300
threads. Here a connection that sends nothing for CONNECTION_TIMEOUT_SECONDS is closed.
"""

from __future__ import annotations

import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

CONNECTION_TIMEOUT_SECONDS = 10.0


class _Server(ThreadingWSGIServer):
    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError)):
            return  # a silent or vanished client, closed: nothing for the operator's log
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def start_metrics_server(
    port: int,
    addr: str,
    registry: CollectorRegistry,
    timeout: float = CONNECTION_TIMEOUT_SECONDS,
) -> ThreadingWSGIServer:
    class Handler(WSGIRequestHandler):
        def setup(self) -> None:
            self.timeout = timeout  # socketserver applies it to the connection's socket
            super().setup()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # a scrape every few seconds is not news

    server = make_server(addr, port, make_wsgi_app(registry), _Server, Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
