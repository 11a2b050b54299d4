"""The frontend's settings, built from its flags (server/__main__.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.limits import Limits


@dataclass
class Settings:
    scheduler: str = "127.0.0.1:50051"
    api_keys: list[str] = field(default_factory=list)
    require_models: list[str] = field(default_factory=list)
    metrics_public: bool = False
    limits: Limits = field(default_factory=Limits)
    # --chat-template: a file path or the template text; None = each model's own template.
    chat_template: str | None = None
    scheduler_auth_token: str = ""  # --frontend-auth-token, sent with every scheduler call
    scheduler_reconnect_timeout: float = 30.0  # live requests wait this long for the scheduler
