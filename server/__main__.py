"""`python -m server`: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import uvicorn

from kvledger.flags import FRONTEND, parse
from kvledger.log import setup_logging
from server.app import Settings, build_app


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(FRONTEND, argv, "kvledger frontend: OpenAI-compatible HTTP API")
    setup_logging("frontend", args.log_level)
    app = build_app(Settings(scheduler=args.scheduler, api_keys=args.api_key,
                             require_models=args.require_model))
    uvicorn.run(app, host=args.host, port=args.port, log_config=None,
                log_level=args.log_level, timeout_graceful_shutdown=3)


if __name__ == "__main__":
    main(sys.argv[1:])
