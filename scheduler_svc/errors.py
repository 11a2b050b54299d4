"""The one refusal the scheduler service raises before a request or a worker is served."""

from __future__ import annotations

import grpc


class PlacementError(Exception):
    """A registration, or a request, that cannot be served: the gRPC status to answer with
    and a message for the caller. Raised by the checks (registration, admission) and by
    placement; the servicers turn it into the call's status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
