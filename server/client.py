"""The frontend's view of the scheduler: a gRPC channel and the catalogue of served models."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenizers import Tokenizer

from kvledger.rpc import CHANNEL_OPTIONS
from protos import frontend_pb2, frontend_pb2_grpc
from server.errors import APIError

CATALOG_TTL_SECONDS = 1.0


@dataclass(frozen=True)
class ServedModel:
    info: frontend_pb2.ModelInfo
    tokenizer: Tokenizer

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def is_embedding(self) -> bool:
        return self.info.kind == frontend_pb2.MODEL_KIND_EMBED


class SchedulerClient:
    def __init__(self, target: str, required_models: tuple[str, ...] = ()) -> None:
        self.required_models = required_models
        self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.stub = frontend_pb2_grpc.SchedulerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._models: dict[str, ServedModel] = {}
        self._fetched_at = -1e9
        self._tokenizers: dict[str, Tokenizer] = {}
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self.channel.close()

    async def is_serving(self) -> bool:
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def models(self, refresh: bool = False) -> dict[str, ServedModel]:
        async with self._lock:
            if refresh or time.monotonic() - self._fetched_at > CATALOG_TTL_SECONDS:
                reply = await self.stub.ListModels(frontend_pb2.ListModelsRequest(), timeout=5.0)
                self._models = {
                    m.name: ServedModel(m, self._tokenizer(m.model_path)) for m in reply.models
                }
                self._fetched_at = time.monotonic()
            return self._models

    async def model(self, name: str) -> ServedModel:
        models = await self.models()
        if name not in models:
            models = await self.models(refresh=True)
        if name not in models and name in self.required_models:
            raise APIError(503, f"no worker for model `{name}` is up", param="model")
        if name not in models:
            raise APIError(
                404, f"The model `{name}` does not exist.", param="model", code="model_not_found"
            )
        return models[name]

    def _tokenizer(self, model_path: str) -> Tokenizer:
        if model_path not in self._tokenizers:
            tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
            # Some checkpoints ship padding/truncation for training; lengths are checked here.
            tokenizer.no_padding()
            tokenizer.no_truncation()
            self._tokenizers[model_path] = tokenizer
        return self._tokenizers[model_path]
