"""The images' HEALTHCHECK: one GET on the container's loopback; healthy on a 2xx answer.

The URL is `KVLEDGER_HEALTHCHECK_URL`, else the frontend's /health at `KVLEDGER_PORT` (8000): what
the image's default command (`kvledger serve`) answers. A scheduler or worker alone has no HTTP
API, so docker-compose.yml gives those services their /metrics URL instead.
Standard library only: the runtime image has no curl or wget.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("KVLEDGER_PORT", "8000")
    url = os.environ.get("KVLEDGER_HEALTHCHECK_URL", f"http://127.0.0.1:{port}/health")
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return 0 if 200 <= answer.status < 300 else 1
    except OSError as err:
        print(f"{url}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
