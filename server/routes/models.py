"""/v1/models and /v1/models/{model}: the models a worker serves and this frontend can load."""

from __future__ import annotations

import grpc
from fastapi import APIRouter, Request

from server.client import ServedModel
from server.deps import scheduler
from server.errors import APIError, error_responses, from_grpc
from server.responses import ModelCard, ModelList

router = APIRouter()


def card(model: ServedModel) -> ModelCard:
    return ModelCard(id=model.name, root=model.name, max_model_len=model.info.max_model_len)


async def _served(request: Request) -> list[ServedModel]:
    """Generative models first (clients that take the first model get one that generates),
    each group in the scheduler's order."""
    try:
        models = await scheduler(request).models(refresh=True)
    except grpc.aio.AioRpcError as err:
        raise from_grpc(err) from None
    return sorted(models.values(), key=lambda m: m.is_embedding)


@router.get("/v1/models", response_model=ModelList, responses=error_responses(503))
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[card(m) for m in await _served(request)])


@router.get(
    "/v1/models/{model:path}", response_model=ModelCard, responses=error_responses(404, 503)
)
async def get_model(model: str, request: Request) -> ModelCard:
    for served in await _served(request):
        if served.name == model:
            return card(served)
    raise APIError(
        404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
    )
