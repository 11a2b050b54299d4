"""FastAPI dependencies every router shares: settings, the scheduler client, the API key's
tenant (auth), and a model looked up by name."""

from __future__ import annotations

import hashlib
import hmac

import grpc
from fastapi import Request
from fastapi.security import HTTPBearer

from kvledger.config.frontend import Settings
from server.client import SchedulerClient, ServedModel
from server.errors import APIError, from_grpc

# Declares the bearer scheme in the OpenAPI schema; `tenant` checks the key itself.
bearer = HTTPBearer(auto_error=False, scheme_name="apiKey", description="an --api-key")


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def scheduler(request: Request) -> SchedulerClient:
    return request.app.state.scheduler


def tenant(request: Request) -> str:
    """The API key's tenant ('' when the server is open); 401 for a missing or wrong key."""
    keys = settings_of(request).api_keys
    if not keys:
        return ""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer":
        matches = [hmac.compare_digest(token.encode(), k.encode()) for k in keys]
        if any(matches):
            return hashlib.sha256(token.encode()).hexdigest()[:16]
    raise APIError(401, "Incorrect or missing API key.", code="invalid_api_key")


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
