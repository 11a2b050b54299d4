"""Logging: `--log-format json` writes one JSON object per line, with the request id on lines
about a request; text stays human-readable and names the request too."""

from __future__ import annotations

import json
import logging

import pytest

from kvledger.log import REQUEST_ID, setup_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_service_level_message_and_request_id(capsys, restore_logging):
    setup_logging("scheduler", "info", "json")
    log = logging.getLogger("scheduler_svc.test")
    log.info("no request here")
    token = REQUEST_ID.set("cmpl-abc-0")
    try:
        log.warning("about %s", "a request")
    finally:
        REQUEST_ID.reset(token)
    log.warning("explicit", extra={"request_id": "cmpl-xyz-1"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [x["message"] for x in lines] == [
        "no request here",
        "about a request",
        "explicit",
        "failed",
    ]
    assert all(x["service"] == "scheduler" and x["logger"] == "scheduler_svc.test" for x in lines)
    assert [x.get("request_id") for x in lines] == [None, "cmpl-abc-0", "cmpl-xyz-1", None]
    assert lines[1]["level"] == "warning" and lines[0]["time"].endswith("Z")
    assert "ValueError: boom" in lines[3]["exception"]


def test_text_lines_name_the_request(capsys, restore_logging):
    setup_logging("worker", "info", "text")
    logging.getLogger("worker.x").warning("refused", extra={"request_id": "cmpl-1-0"})
    line = capsys.readouterr().err.strip()
    assert "[worker] worker.x: refused [request cmpl-1-0]" in line


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="log format"):
        setup_logging("frontend", "info", "yaml")
