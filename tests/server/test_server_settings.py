"""Frontend settings from flags: API keys from flags, environment and a keys file; limits."""

from __future__ import annotations

import pytest

from kvledger.flags import FRONTEND, parse
from server.__main__ import settings_from_args


def test_keys_come_from_flags_and_a_keys_file(tmp_path, monkeypatch):
    keys = tmp_path / "keys"
    keys.write_text("# tenants\nalpha\n\n  beta  \n")
    args = parse(FRONTEND, ["--api-key", "gamma", "--api-keys-file", str(keys)], "t")
    assert settings_from_args(args).api_keys == ["gamma", "alpha", "beta"]
    monkeypatch.setenv("KVLEDGER_API_KEY", "delta")
    assert settings_from_args(parse(FRONTEND, [], "t")).api_keys == ["delta"]


def test_limits_follow_their_flags():
    args = parse(
        FRONTEND,
        ["--max-n", "3", "--max-stop-strings", "2", "--max-request-body-bytes", "1000"],
        "t",
    )
    limits = settings_from_args(args).limits
    assert (limits.max_n, limits.max_stop_strings, limits.max_request_body_bytes) == (3, 2, 1000)


def test_a_bad_chat_template_stops_the_frontend_before_it_serves(tmp_path):
    """A path that is not there (a typo) or a template that does not parse: one line naming
    the flag, at startup, instead of a prompt made of the path or a 400 for every chat."""
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    for good in (str(template), template.read_text()):
        args = parse(FRONTEND, ["--chat-template", good], "t")
        assert settings_from_args(args).chat_template == good
    for bad, why in [(str(tmp_path / "chat.jija"), "not a file"), ("{% if %}", "does not parse")]:
        with pytest.raises(SystemExit) as stopped:
            settings_from_args(parse(FRONTEND, ["--chat-template", bad], "t"))
        assert str(stopped.value).startswith("--chat-template") and why in str(stopped.value)


def test_request_deadlines_follow_their_flags_and_refuse_negative_values(monkeypatch):
    args = parse(FRONTEND, [], "t")
    assert (args.timeout_request_header, args.timeout_request_body) == (10.0, 60.0)
    assert settings_from_args(args).limits.timeout_request_body == 60.0
    monkeypatch.setenv("KVLEDGER_TIMEOUT_REQUEST_BODY", "0")
    args = parse(FRONTEND, ["--timeout-request-header", "2.5"], "t")
    assert args.timeout_request_header == 2.5
    assert settings_from_args(args).limits.timeout_request_body == 0  # off
    for flag in ("--timeout-request-header", "--timeout-request-body"):
        with pytest.raises(SystemExit) as stopped:
            settings_from_args(parse(FRONTEND, [flag, "-1"], "t"))
        assert str(stopped.value).startswith(flag)


def test_a_missing_keys_file_stops_the_frontend_before_it_serves(tmp_path):
    args = parse(FRONTEND, ["--api-keys-file", str(tmp_path / "keys")], "t")
    with pytest.raises(SystemExit) as stopped:
        settings_from_args(args)
    assert str(stopped.value).startswith("--api-keys-file")


def test_the_settings_are_the_flags():
    """No field changes its name on the way from the flag to the app."""
    args = parse(FRONTEND, ["--require-model", "m", "--max-n", "3", "--port", "9"], "t")
    settings = settings_from_args(args)
    assert (settings.require_model, settings.limits.max_n, settings.port) == (["m"], 3, 9)
    assert settings.limits.timeout_request_header == args.timeout_request_header
