"""The database of stored responses (server/responses_api/store.py): rows kept per tenant,
read back as the conversation a continuation starts from, expired past the retention, the
oldest deleted past the byte budget, shared by two stores over one file (two frontends), and
a --responses-store the frontend cannot use stopping it at startup, naming the cause."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from server.responses_api.store import ResponseStore, StoreError, store_path

ASK = {"type": "message", "id": "msg_1", "role": "user", "content": "hi"}


def response(rid: str, text: str = "hello") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    message = {"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant"}
    return {"id": rid, "object": "response", "output": [{**message, "content": [part]}]}


def make(tmp_path, retention_s: float = 3600.0, max_bytes: int = 1 << 20) -> ResponseStore:  # noqa: ANN001
    return ResponseStore(tmp_path / "r.sqlite3", retention_s, max_bytes)


def test_a_row_is_its_tenants_and_continues_as_items_then_output(tmp_path):
    store = make(tmp_path)
    assert store.put("tenant-a", response("resp_1"), [ASK])
    stored = store.get("tenant-a", "resp_1")
    assert stored is not None and stored.response == response("resp_1")
    assert stored.conversation == [ASK, *response("resp_1")["output"]]
    assert store.get("tenant-b", "resp_1") is None  # another key sees nothing
    assert not store.delete("tenant-b", "resp_1")
    assert store.delete("tenant-a", "resp_1") and store.get("tenant-a", "resp_1") is None
    assert not store.delete("tenant-a", "resp_1")
    store.close()


def test_rows_past_the_retention_are_neither_read_nor_kept(tmp_path):
    store = make(tmp_path, retention_s=0.2)
    store.put("", response("resp_old"), [ASK])
    time.sleep(0.3)
    assert store.get("", "resp_old") is None
    before = store.stored_bytes()
    store.put("", response("resp_new"), [ASK])  # each write deletes what expired
    assert store.stored_bytes() < 2 * before and store.get("", "resp_new") is not None


def test_the_oldest_go_past_the_byte_budget_and_a_row_too_large_is_not_kept(tmp_path):
    one = len(response("resp_0").__repr__()) + 64  # more than one row's JSON
    store = make(tmp_path, max_bytes=3 * one)
    for k in range(6):
        assert store.put("", response(f"resp_{k}"), [ASK])
    kept = [k for k in range(6) if store.get("", f"resp_{k}") is not None]
    assert kept == list(range(6 - len(kept), 6)) and 1 <= len(kept) <= 3  # the newest
    assert store.stored_bytes() <= 3 * one
    assert not store.put("", response("resp_big", "x" * (4 * one)), [ASK])
    assert store.get("", "resp_big") is None and store.get("", "resp_5") is not None


def test_two_stores_over_one_file_share_it(tmp_path):
    """Two frontends (replicas, or one restarted) given the same file."""
    first, second = make(tmp_path), make(tmp_path)
    first.put("", response("resp_1"), [ASK])
    assert second.get("", "resp_1") is not None
    assert second.delete("", "resp_1") and first.get("", "resp_1") is None


def test_what_the_flag_names(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLEDGER_CACHE_DIR", str(tmp_path))
    assert store_path("") == tmp_path / "responses.sqlite3"
    assert store_path("off") is None
    assert str(store_path("sqlite:///srv/r.db")) == "/srv/r.db"
    assert store_path(str(tmp_path / "x.db")) == tmp_path / "x.db"
    with pytest.raises(StoreError, match="only SQLite"):
        store_path("postgresql://db/kv")


def test_a_store_it_cannot_use_stops_the_frontend_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StoreError, match="a-file"):
        ResponseStore(blocker / "r.sqlite3", 60.0, 1 << 20).open()
    for url, said in ((str(blocker / "r.sqlite3"), "a-file"), ("mysql://x/y", "only SQLite")):
        run = subprocess.run(
            [sys.executable, "-m", "server", "--responses-store", url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode != 0 and said in run.stderr, run.stderr
