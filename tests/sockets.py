"""Reading a raw HTTP/1.1 connection until the server ends it (the slow-client tests)."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass


@dataclass
class Ended:
    """How the server ended a connection: what it sent, and when the connection closed,
    counted from `start` (when the client had sent what starts the deadline)."""

    data: bytes
    seconds: float
    how: str  # "eof" (the server closed it), "reset", or "open" (still open after the wait)

    @property
    def statuses(self) -> list[int]:
        lines = self.data.split(b"\r\n")
        return [int(line.split()[1]) for line in lines if line.startswith(b"HTTP/1.1 ")]

    def error(self) -> dict:
        return json.loads(self.data[self.data.rindex(b"\r\n\r\n") + 4 :])["error"]


def read_until_closed(sock: socket.socket, start: float, wait: float) -> Ended:
    sock.settimeout(0.2)
    data = b""
    while time.monotonic() - start < wait:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return Ended(data, time.monotonic() - start, "reset")
        if not chunk:
            return Ended(data, time.monotonic() - start, "eof")
        data += chunk
    return Ended(data, time.monotonic() - start, "open")
