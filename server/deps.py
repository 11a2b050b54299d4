"""FastAPI dependencies every router shares: settings, the scheduler client, the API key's
tenant (auth), and a model looked up by name."""

from __future__ import annotations

import hashlib
import hmac

import grpc
from fastapi import Request
from fastapi.security import APIKeyHeader, HTTPBearer

from kvledger.config.frontend import Settings
from server.client import SchedulerClient, ServedModel
from server.errors import APIError, from_grpc

# Declare the key's schemes in the OpenAPI schema; `tenant` checks the key itself.
bearer = HTTPBearer(auto_error=False, scheme_name="apiKey", description="an --api-key")
x_api_key = APIKeyHeader(
    name="x-api-key", auto_error=False, scheme_name="xApiKey",
    description="an --api-key, as Anthropic's clients send it",
)  # fmt: skip


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def scheduler(request: Request) -> SchedulerClient:
    return request.app.state.scheduler


def tenant(request: Request) -> str:
    """The API key's tenant ('' when the server is open); 401 for a missing or wrong key.
    The key comes as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
    (Anthropic's), on every route: one key is one tenant whichever header carries it."""
    keys = settings_of(request).api_keys
    if not keys:
        return ""
    for token in presented_keys(request):
        matches = [hmac.compare_digest(token.encode(), k.encode()) for k in keys]
        if any(matches):
            return hashlib.sha256(token.encode()).hexdigest()[:16]
    raise APIError(401, "Incorrect or missing API key.", code="invalid_api_key")


def presented_keys(request: Request) -> list[str]:
    """The keys a request presents: its bearer token, then its x-api-key."""
    keys = []
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        keys.append(token)
    if "x-api-key" in request.headers:
        keys.append(request.headers["x-api-key"])
    return keys


def tenant_salt(tenant_id: str, cache_salt: str | None) -> str:
    """Namespaces the prefix cache per API key: no client can borrow another tenant's salt."""
    if not tenant_id and not cache_salt:
        return ""
    return hashlib.sha256(f"{tenant_id}\0{cache_salt or ''}".encode()).hexdigest()


def tenant_tag(tenant_id: str) -> str:
    """What the scheduler learns of a tenant (`GenerateRequest.tenant`, for the fair policy):
    a tag to tell tenants apart, hashed again so that it gives away neither the API key nor
    the tenant id that cache salts derive from. An open server's '' stays ''."""
    if not tenant_id:
        return ""
    return hashlib.sha256(f"kvledger-tenant-tag\0{tenant_id}".encode()).hexdigest()[:16]


async def model_for(request: Request, name: str) -> ServedModel:
    try:
        return await scheduler(request).model(name)
    except grpc.aio.AioRpcError as err:
        raise from_grpc(err) from None


async def named_or_only_model(request: Request, name: str | None) -> ServedModel:
    """The model `name`s; without a name, the only generative model served (vLLM's
    /tokenize serves its one model, and lm-eval's remote tokenizer names none), or the only
    model when none generates. Several to choose from and none named: a 400 naming `model`."""
    if name is not None:
        return await model_for(request, name)
    try:
        models = await scheduler(request).models()
    except grpc.aio.AioRpcError as err:
        raise from_grpc(err) from None
    candidates = [m for m in models.values() if not m.is_embedding] or list(models.values())
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise APIError(503, "no model is served now", param="model")
    names = ", ".join(sorted(m.name for m in candidates))
    raise APIError(
        400, f"`model` is required: this server serves several models ({names})", param="model"
    )
