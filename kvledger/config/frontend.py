"""The frontend's configuration: every flag of `python -m server` is a field here
(kvledger/options.py derives the flags, their environment variables and help from it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from kvledger.groups import (
    LOOPBACK,
    FrontendToken,
    GrammarLimits,
    GrpcTlsOptions,
    LogOptions,
    MetricsOptions,
    SchedulerAddress,
    ShutdownOptions,
)
from kvledger.options import group, option


@dataclass(frozen=True)
class Limits(GrammarLimits):
    """Request and connection limits, checked before any model work (server/limits.py); what
    a structured-output constraint may cost (GrammarLimits, shared with the worker)."""

    max_request_body_bytes: int = option(4 * 1024 * 1024, "largest accepted request body")
    max_prompts_per_request: int = option(64, "most prompts (times n) in one completion")
    max_n: int = option(16, "largest n of one completion")
    max_stop_strings: int = option(16, "most stop strings per request")
    max_stop_string_length: int = option(256, "longest stop string")
    limit_concurrency: int = option(
        1000,
        "most connections and requests the frontend holds at once; past it, new ones get 503 "
        "(slow or idle clients cannot exhaust its file descriptors; uvicorn's name)",
    )
    timeout_keep_alive: int = option(
        5, "seconds an idle kept-alive connection stays open (uvicorn's name)"
    )
    timeout_request_header: float = option(
        10.0,
        "seconds a client has to send a request line and headers, from the connection's "
        "start or the first byte of a kept-alive connection's next request; past it the "
        "connection is closed (with a 408 if part of a request came); 0 = no limit",
    )
    timeout_request_body: float = option(
        60.0,
        "seconds a client has to send a request body after its headers; past it a 408 and "
        "the connection is closed; 0 = no limit",
    )
    max_embedding_inputs: int = option(256, "most inputs of one embeddings request")
    max_rerank_documents: int = option(
        256,
        "most documents of one rerank request, and most texts in text_1 or text_2 of one "
        "/score request (each pair is truncated to the cross-encoder's length)",
    )
    max_messages: int = option(1024, "most messages of one chat (or /tokenize) request")
    max_content_parts: int = option(
        1024, "most content parts across the messages of one chat (or /tokenize) request"
    )
    max_stop_token_ids: int = option(64, "most stop_token_ids per request")
    max_logit_bias: int = option(1024, "most logit_bias entries per request")
    max_chat_template_kwargs_chars: int = option(
        16384,
        "most characters in chat_template_kwargs (its keys and strings, with one counted for "
        "each other value)",
    )
    max_token_ids: int = option(
        65536,
        "most token ids in one request's prompts (completions, embeddings) or tokens "
        "(/detokenize); each prompt must also fit its model's context",
    )
    max_json_values: int = option(
        262144,
        "most JSON values in one request body (numbers, strings, lists, objects and nulls; "
        "object keys not counted)",
    )
    max_name_length: int = option(
        256, "longest model name, user, cache_salt and message name in a request"
    )
    max_structured_chars: int = option(
        65536,
        "most characters in a structured-output constraint (a JSON schema's keys and strings, "
        "with one counted for each other value; a regex, grammar or the choices)",
    )
    structured_compile_timeout: float = option(
        2.0,
        "CPU seconds the frontend's check of a structured-output constraint may compile for "
        "(in a low-priority child process of its own, killed past it, or past ten times as "
        "much wall time, at least 30 s); more is a 400",
        ge=0.01,
    )
    max_tools: int = option(128, "most tools (functions) one chat request offers")
    max_tools_chars: int = option(
        65536,
        "most characters in a chat request's tools (names, descriptions and parameter schemas: "
        "keys and strings, with one counted for each other value)",
    )


@dataclass(frozen=True)
class ResponsesStoreOptions:
    """Where /v1/responses keeps the responses it stores (server/responses_api/store.py)."""

    responses_store: str = option(
        "",
        "database of stored /v1/responses (`store`, `previous_response_id`, GET and DELETE): "
        "a `sqlite:///PATH` URL or a file path, shared by every frontend given the same file; "
        "'' = responses.sqlite3 in the cache directory (KVLEDGER_CACHE_DIR, default "
        "~/.cache/kvledger); `off` = nothing is stored",
    )
    responses_retention: float = option(
        30 * 24 * 3600.0,
        "seconds a stored response is kept; older ones are deleted, and read as never stored",
        ge=0.0,
    )
    responses_store_bytes: int = option(
        1024**3,
        "most bytes of stored responses (their JSON, inputs included); past it the oldest "
        "are deleted, and a response larger than all of it is not stored",
        ge=0,
    )


@dataclass(frozen=True)
class Settings(
    FrontendToken, SchedulerAddress, GrpcTlsOptions, MetricsOptions, ShutdownOptions, LogOptions
):
    """`python -m server`'s flags. The frontend's /metrics is on its HTTP port; --metrics-port
    adds a keyless endpoint (DEFAULT_METRICS_PORT None: none unless asked)."""

    host: str = option(LOOPBACK, "address the HTTP frontend binds")
    port: int = option(8000, "HTTP port of the frontend")
    api_key: list[str] = option([], "accepted API key (repeatable); none = open", secret=True)
    require_model: list[str] = option(
        [], "model that must have a live worker for /health to be 200 (repeatable)"
    )
    api_keys_file: str | None = option(None, "file with one accepted API key per line")
    metrics_public: bool = option(False, "serve /metrics without an API key")
    limits: Limits = group(Limits)
    responses: ResponsesStoreOptions = group(ResponsesStoreOptions)
    # A file path or the template text; None = each model's own template.
    chat_template: str | None = option(
        None,
        "chat template for /v1/chat/completions (a file path or the template text), used "
        "instead of each model's own",
    )
    special_tokens_in_content: bool = option(
        False,
        "tokenize special-token text inside chat message content (and chat_template_kwargs) "
        "as the special tokens themselves; off (the default), such text is tokenized as plain "
        "text, so a message cannot close its turn or forge another role's",
    )
    scheduler_reconnect_timeout: float = option(
        30.0,
        "seconds a live request waits for a lost scheduler (restarted, or unreachable) before "
        "it fails; once the scheduler answers again, the request goes on where its stream "
        "was, as a continuation; 0 = fail at once",
    )

    @functools.cached_property
    def api_keys(self) -> list[str]:
        """Every accepted key: --api-key (or its variable), then --api-keys-file's lines
        (blank lines and `#` comments skipped). Read once, at startup (server/__main__.py)."""
        keys = list(self.api_key)
        if self.api_keys_file:
            lines = Path(self.api_keys_file).read_text().splitlines()
            keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return keys
