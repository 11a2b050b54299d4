"""Logging setup: every line says which service wrote it, and, where it concerns a request,
which request (`--log-format json` writes one JSON object per line for log pipelines)."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar

# The request a line concerns: set by the code that handles one request (an HTTP request in
# the frontend, a Generate call in the scheduler); asyncio tasks and threads started from
# there inherit it. A log call may also pass `extra={"request_id": ...}`.
REQUEST_ID: ContextVar[str | None] = ContextVar("kvledger_request_id", default=None)

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, service, logger, message, and
    request_id and exception when there is one."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [request {request_id}]" if request_id else line


def setup_logging(service: str, level: str = "info", fmt: str = "text") -> None:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(
            _TextFormatter(
                f"%(asctime)s %(levelname)-5s [{service}] %(name)s: %(message)s", "%H:%M:%S"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
