"""The frontend's view of the scheduler: a gRPC channel and the catalogue of served models."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Counter
from tokenizers import Tokenizer

from kvledger.gguf_file import GGUFError, is_gguf
from kvledger.gguf_tokenizer import load_gguf_tokenizer
from kvledger.grpc_auth import bearer_interceptors
from kvledger.rpc import CHANNEL_OPTIONS
from kvledger.tls import TlsFiles, aio_channel
from protos import frontend_pb2, frontend_pb2_grpc
from server.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from server.errors import APIError
from server.plain_content import SpecialTexts
from server.token_bytes import TokenBytes

log = logging.getLogger(__name__)

CATALOG_TTL_SECONDS = 1.0
# A model directory whose tokenizer failed to load is tried again at most this often: a volume
# mounted late is picked up, and a broken file is not parsed again on every catalogue refresh.
TOKENIZER_RETRY_SECONDS = 10.0


@dataclass(frozen=True)
class ServedModel:
    info: frontend_pb2.ModelInfo
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def is_embedding(self) -> bool:
        return self.info.kind == frontend_pb2.MODEL_KIND_EMBED

    @property
    def is_cross_encoder(self) -> bool:
        """A sequence classifier: it scores text pairs (rerank, score), it embeds nothing."""
        return self.info.num_labels > 0

    @functools.cached_property
    def pair_tokenizer(self) -> Tokenizer:
        """The tokenizer as sentence-transformers' `CrossEncoder` runs it on a text pair: both
        texts with the pair's special tokens and token types, truncated longest text first to
        the model's length (a copy: the shared one never truncates)."""
        tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.info.max_model_len, strategy="longest_first")
        return tokenizer

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """Characters past which a text cannot fit the context, whatever it says: each token
        covers at most the longest vocabulary entry's characters (markers such as `##` or
        `Ġ` count too, so this errs long). Texts longer than this are refused before
        tokenizing: a prompt of a few MB took the frontend's memory up several times over to
        find out (docs/performance.md, "Frontend under large requests")."""
        longest = max((len(piece) for piece in self.tokenizer.get_vocab()), default=1)
        return self.info.max_model_len * max(longest, 1)

    @functools.cached_property
    def special_texts(self) -> SpecialTexts:
        """Its special tokens as text, for chat content (server/plain_content.py)."""
        return SpecialTexts.of(self.tokenizer)

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's own bytes, for logprobs (server/token_bytes.py)."""
        return TokenBytes.of(self.tokenizer)


class SchedulerClient:
    def __init__(
        self,
        target: str,
        required_models: tuple[str, ...] = (),
        chat_template: str | None = None,
        auth_token: str = "",
        reconnect_timeout: float = 0.0,
        resumptions: Counter | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.required_models = required_models
        # seconds a live request waits for a broken scheduler link to come back before it
        # fails; 0 = fail at once (server/resume.py)
        self.reconnect_timeout = reconnect_timeout
        self._resumptions = resumptions
        self.chat_template_override = chat_template
        self._templates: dict[str, ChatTemplate | None] = {}
        interceptors = bearer_interceptors(auth_token) if auth_token else None
        self.channel = aio_channel(target, tls or TlsFiles(), CHANNEL_OPTIONS, interceptors)
        self.stub = frontend_pb2_grpc.SchedulerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._models: dict[str, ServedModel] = {}
        # Registered models this frontend cannot serve: name -> why (its tokenizer won't load).
        self.unloadable: dict[str, str] = {}
        # Every model this frontend has seen served: one missing now lost its workers (or the
        # scheduler restarted and they have not registered again yet), so 503, not 404.
        self._seen: set[str] = set(required_models)
        self._fetched_at = -1e9
        self._tokenizers: dict[str, Tokenizer] = {}
        self._tokenizer_failures: dict[str, tuple[str, float]] = {}  # path -> (why, when)
        self._lock = asyncio.Lock()

    def count_resumption(self, outcome: str) -> None:
        """A live request whose scheduler link broke was resumed, or gave up."""
        if self._resumptions is not None:
            self._resumptions.labels(outcome).inc()

    async def close(self) -> None:
        await self.channel.close()

    async def is_serving(self) -> bool:
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def models(self, refresh: bool = False) -> dict[str, ServedModel]:
        """The models this frontend can serve: registered, and with a tokenizer it could load.
        The others are in `unloadable`; one of them never keeps the rest from serving."""
        async with self._lock:
            if refresh or time.monotonic() - self._fetched_at > CATALOG_TTL_SECONDS:
                reply = await self.stub.ListModels(frontend_pb2.ListModelsRequest(), timeout=5.0)
                await self._read_gguf_files(reply.models)
                models, unloadable = {}, {}
                for m in reply.models:
                    try:
                        tokenizer = self._tokenizer(m.name, m.tokenizer_path or m.model_path)
                        models[m.name] = ServedModel(m, tokenizer, self._template(m))
                    except TokenizerUnavailable as err:
                        unloadable[m.name] = str(err)
                self._models, self.unloadable = models, unloadable
                self._seen.update(models)
                self._fetched_at = time.monotonic()
            return self._models

    async def model(self, name: str) -> ServedModel:
        models = await self.models()
        if name not in models and name not in self.unloadable:
            models = await self.models(refresh=True)
        if name not in models and name in self.unloadable:
            raise APIError(
                503,
                f"The model `{name}` is unavailable: this server cannot load its tokenizer "
                "from the model directory its worker reported (the frontend's log says why).",
                param="model",
                code="model_unavailable",
            )
        if name not in models and name in self._seen:
            raise APIError(503, f"no worker for model `{name}` is up", param="model")
        if name not in models:
            raise APIError(
                404, f"The model `{name}` does not exist.", param="model", code="model_not_found"
            )
        return models[name]

    async def _read_gguf_files(self, infos: Iterable[frontend_pb2.ModelInfo]) -> None:
        """Parse new GGUF files off the event loop (seconds for a large vocabulary; the
        result is cached by path): the loop keeps answering meanwhile. A file that fails
        here fails again, and is reported, when its tokenizer is loaded."""
        for info in infos:
            path = info.tokenizer_path or info.model_path
            if is_gguf(path) and path not in self._tokenizers:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(load_gguf_tokenizer, path)

    def _template(self, info: frontend_pb2.ModelInfo) -> ChatTemplate | None:
        """The model's chat template (--chat-template first, then the --tokenizer directory's,
        then the model's), read once per directory; an embedding model has none."""
        if info.kind == frontend_pb2.MODEL_KIND_EMBED:
            return None
        source = info.tokenizer_path or info.model_path  # --tokenizer's directory first
        if source not in self._templates:
            try:
                template = load_chat_template(source, self.chat_template_override)
            except (OSError, ChatTemplateError, GGUFError) as err:
                log.error("model %s: cannot read its chat template: %s", info.name, err)
                template = None
            self._templates[source] = template
        return self._templates[source]

    def _tokenizer(self, name: str, model_path: str) -> Tokenizer:
        """The tokenizer in the model's directory (loaded once); TokenizerUnavailable when it
        cannot be loaded here (another host's path, a volume not mounted, a broken file),
        logged once per cause, not on every catalogue refresh."""
        if model_path in self._tokenizers:
            return self._tokenizers[model_path]
        failed = self._tokenizer_failures.get(model_path)
        if failed is not None and time.monotonic() - failed[1] < TOKENIZER_RETRY_SECONDS:
            raise TokenizerUnavailable(failed[0])
        gguf = is_gguf(model_path)
        file = Path(model_path) if gguf else Path(model_path) / "tokenizer.json"
        try:
            tokenizer = (
                load_gguf_tokenizer(model_path).tokenizer
                if gguf
                else Tokenizer.from_file(str(file))
            )
        except Exception as err:  # noqa: BLE001 - any failure: this one model is unavailable
            why = f"cannot load {file}: {err}"
            if failed is None or failed[0] != why:
                log.error(
                    "model %s: %s; its requests are answered 503 until it can be loaded "
                    "(other models are not affected)",
                    name,
                    why,
                )
            self._tokenizer_failures[model_path] = (why, time.monotonic())
            raise TokenizerUnavailable(why) from err
        if failed is not None:
            log.info("model %s: tokenizer loaded from %s", name, file)
            del self._tokenizer_failures[model_path]
        # Some checkpoints ship padding/truncation for training; lengths are checked here.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizers[model_path] = tokenizer
        return tokenizer


class TokenizerUnavailable(Exception):
    """A model's tokenizer cannot be loaded by this frontend."""
