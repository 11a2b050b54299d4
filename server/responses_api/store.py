"""Stored responses: what `store` keeps, `previous_response_id` continues, and `GET` and
`DELETE /v1/responses/{id}` read and remove. A SQLite database (the standard library's
sqlite3), so a conversation outlives the frontend that began it, and every frontend given the
same file (replicas on one host, or one shared volume) continues each other's.

The rules:
- A row is a response (its JSON, as sent) and the input items the model read for it (stored
  ones included): the conversation a continuation starts from is those items, then its output.
- A row belongs to the tenant (API key) that stored it: another tenant's lookup finds nothing,
  as if it had never been stored (a 404, never a 403 that tells it exists).
- Rows older than the retention are deleted before every write and never read; past the byte
  budget the oldest are deleted; a row larger than the whole budget is not written (`put`
  says so, and the response then says `store: false`).
- Calls block (disk I/O): the routes run them in a thread. Each thread has its own
  connection; WAL journaling lets several processes read while one writes."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvledger.models import cache_dir

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, "
    "created REAL NOT NULL, size INTEGER NOT NULL, response TEXT NOT NULL, "
    "items TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS responses_created ON responses (created)",
)
OFF = "off"
LOCK_TIMEOUT_S = 30.0


class StoreError(ValueError):
    """A --responses-store the frontend cannot use: startup stops naming it."""


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]
    items: list[dict[str, Any]]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a continuation reads first: the items, then the response's output."""
        return self.items + self.response["output"]


def store_path(url: str) -> Path | None:
    """The database file `url` names (None: `off`). '' is the cache directory's."""
    if url == OFF:
        return None
    if not url:
        return cache_dir() / "responses.sqlite3"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return Path(url).expanduser()
    if scheme != "sqlite" or not rest:
        raise StoreError(
            f"--responses-store {url!r}: only SQLite is served (`sqlite:///PATH`, a file "
            "path, or `off`)"
        )
    return Path(rest).expanduser()


def store_for(url: str, retention_s: float, max_bytes: int) -> ResponseStore | None:
    """The store --responses-store names, not opened yet (None: `off`)."""
    path = store_path(url)
    return None if path is None else ResponseStore(path, retention_s, max_bytes)


class ResponseStore:
    def __init__(self, path: Path, retention_s: float, max_bytes: int) -> None:
        self.path = path
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._opened = False

    def open(self) -> None:
        """Creates the file and its table if need be (the server calls it at startup, so that
        a path it cannot use stops it; any first call does it too)."""
        if self._opened:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connection()
            db.execute("PRAGMA journal_mode=WAL")
            for statement in SCHEMA:
                db.execute(statement)
        except (OSError, sqlite3.Error) as err:
            raise StoreError(f"--responses-store {str(self.path)!r}: {err}") from None
        self._opened = True

    def put(self, tenant: str, response: dict[str, Any], items: list[dict[str, Any]]) -> bool:
        """Stores the response (replacing none: ids are unique); False if it cannot fit."""
        text, listed = json.dumps(response, ensure_ascii=False), json.dumps(items)
        size = len(text.encode()) + len(listed.encode())
        if size > self.max_bytes:
            return False
        now = time.time()
        self.open()
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM responses WHERE created < ?", (now - self.retention_s,))
            db.execute(
                "INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                (response["id"], tenant, now, size, text, listed),
            )
            self._trim(db)
        return True

    def get(self, tenant: str, response_id: str) -> Stored | None:
        self.open()
        oldest = time.time() - self.retention_s
        row = self._connection().execute(
            "SELECT response, items FROM responses WHERE id = ? AND tenant = ? AND created >= ?",
            (response_id, tenant, oldest),
        )
        found = row.fetchone()
        return Stored(json.loads(found[0]), json.loads(found[1])) if found else None

    def delete(self, tenant: str, response_id: str) -> bool:
        self.open()
        with self._connection() as db:
            cursor = db.execute(
                "DELETE FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant)
            )
        return cursor.rowcount > 0

    def stored_bytes(self) -> int:
        self.open()
        row = self._connection().execute("SELECT COALESCE(SUM(size), 0) FROM responses")
        return int(row.fetchone()[0])

    def close(self) -> None:
        """Closes every thread's connection (the threads' next call would open another)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    def _trim(self, db: sqlite3.Connection) -> None:
        """Deletes the oldest rows until the rest fit the byte budget."""
        total = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
        rows = db.execute("SELECT id, size FROM responses ORDER BY created, rowid")
        doomed = []
        for row_id, size in rows:
            if total <= self.max_bytes:
                break
            doomed.append((row_id,))
            total -= size
        db.executemany("DELETE FROM responses WHERE id = ?", doomed)

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self.path, timeout=LOCK_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection
