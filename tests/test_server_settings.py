"""Frontend settings from flags: API keys from flags, environment and a keys file; limits."""

from __future__ import annotations

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
