"""`python -m server`: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import prometheus_client
import uvicorn

from kvledger.config.frontend import Settings
from kvledger.flags import FRONTEND, config_for, parse
from kvledger.log import setup_logging
from kvledger.metrics_http import start_metrics_server
from kvledger.tls import checked
from server.app import build_app
from server.chat_template import ChatTemplateError, check_chat_template
from server.connections import with_deadlines
from server.http_server import serve
from server.responses_api.store import StoreError

# Request line and headers together: larger is refused instead of buffered (nginx and
# most proxies allow 8-16 KiB).
H11_MAX_HEADER_BYTES = 16 * 1024


def checked_timeouts(settings: Settings) -> None:
    """A negative deadline would close every connection at once: startup stops instead."""
    values = {
        "timeout_request_header": settings.limits.timeout_request_header,
        "timeout_request_body": settings.limits.timeout_request_body,
        "scheduler_reconnect_timeout": settings.scheduler_reconnect_timeout,
    }
    for flag, value in values.items():
        if value < 0:
            name = flag.replace("_", "-")
            raise SystemExit(
                f"--{name} (KVLEDGER_{flag.upper()}): must be 0 (no limit) or more seconds"
            )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The frontend's settings from its parsed flags, checked: startup stops (one line saying
    why) on a negative deadline, a chat template that does not parse, an unreadable keys
    file."""
    settings = config_for(FRONTEND, args)
    checked_timeouts(settings)
    checked_chat_template(settings.chat_template)
    checked(settings, server=False, service="frontend")
    try:
        settings.api_keys  # noqa: B018 - read the keys file now, not at the first request
    except OSError as err:
        raise SystemExit(f"--api-keys-file (KVLEDGER_API_KEYS_FILE): {err}") from None
    return settings


def checked_chat_template(value: str | None) -> str | None:
    """--chat-template as given, once it names a file or parses as a template: otherwise the
    frontend does not start (one line saying why), rather than failing every chat request."""
    if value is not None:
        try:
            check_chat_template(value)
        except ChatTemplateError as err:
            raise SystemExit(f"--chat-template (KVLEDGER_CHAT_TEMPLATE): {err}") from None
    return value


def main(argv: Sequence[str] | None = None) -> None:
    prometheus_client.disable_created_metrics()  # *_created series only add noise here
    settings = settings_from_args(
        parse(FRONTEND, argv, "kvledger frontend: OpenAI-compatible HTTP API")
    )
    setup_logging("frontend", settings.log_level, settings.log_format)
    try:
        app = build_app(settings)
        if app.state.responses_store is not None:
            app.state.responses_store.open()  # a database it cannot use stops it now
    except StoreError as err:
        raise SystemExit(str(err)) from None
    if settings.metrics_port is not None:
        # /metrics without a key, apart from the API: for a Prometheus on an internal network
        start_metrics_server(
            settings.metrics_port, addr=settings.metrics_host, registry=app.state.registry
        )
    limits = settings.limits
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        timeout_graceful_shutdown=settings.shutdown_timeout,
        limit_concurrency=limits.limit_concurrency,
        timeout_keep_alive=limits.timeout_keep_alive,
        # h11 always (not httptools, should it be installed): the header bound below and the
        # header and body deadlines are h11's and this protocol's.
        http=with_deadlines(
            limits.timeout_request_header, limits.timeout_request_body, app.state.request_timeouts
        ),
        h11_max_incomplete_event_size=H11_MAX_HEADER_BYTES,
    )
    serve(config)


if __name__ == "__main__":
    main(sys.argv[1:])
