"""`python -m server`: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import prometheus_client
import uvicorn

from kvledger.flags import FRONTEND, parse
from kvledger.log import setup_logging
from kvledger.metrics_http import start_metrics_server
from server.app import build_app
from server.chat_template import ChatTemplateError, check_chat_template
from server.connections import with_deadlines
from server.limits import Limits
from server.settings import Settings

# Request line and headers together: larger is refused instead of buffered (nginx and
# most proxies allow 8-16 KiB).
H11_MAX_HEADER_BYTES = 16 * 1024


def read_api_keys(args: argparse.Namespace) -> list[str]:
    keys = list(args.api_key)
    if args.api_keys_file:
        lines = Path(args.api_keys_file).read_text().splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return keys


def checked_timeouts(args: argparse.Namespace) -> None:
    """A negative deadline would close every connection at once: startup stops instead."""
    for flag in ("timeout_request_header", "timeout_request_body"):
        if getattr(args, flag) < 0:
            name = flag.replace("_", "-")
            raise SystemExit(
                f"--{name} (KVLEDGER_{flag.upper()}): must be 0 (no limit) or more seconds"
            )


def settings_from_args(args: argparse.Namespace) -> Settings:
    checked_timeouts(args)
    limits = Limits(**{name: getattr(args, name) for name in Limits.__dataclass_fields__})
    return Settings(
        scheduler=args.scheduler,
        api_keys=read_api_keys(args),
        require_models=args.require_model,
        metrics_public=args.metrics_public,
        limits=limits,
        chat_template=checked_chat_template(args.chat_template),
        scheduler_auth_token=args.frontend_auth_token,
        scheduler_reconnect_timeout=args.scheduler_reconnect_timeout,
    )


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
    args = parse(FRONTEND, argv, "kvledger frontend: OpenAI-compatible HTTP API")
    setup_logging("frontend", args.log_level, args.log_format)
    app = build_app(settings_from_args(args))
    if args.metrics_port is not None:
        # /metrics without a key, apart from the API: for a Prometheus on an internal network
        start_metrics_server(args.metrics_port, addr=args.metrics_host, registry=app.state.registry)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
        limit_concurrency=args.limit_concurrency,
        timeout_keep_alive=args.timeout_keep_alive,
        # h11 always (not httptools, should it be installed): the header bound below and the
        # header and body deadlines are h11's and this protocol's.
        http=with_deadlines(
            args.timeout_request_header, args.timeout_request_body, app.state.request_timeouts
        ),
        h11_max_incomplete_event_size=H11_MAX_HEADER_BYTES,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
