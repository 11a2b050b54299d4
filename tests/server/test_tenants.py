"""A request's tenant travels from the API key to the ledger as a tag, never as the key."""

from __future__ import annotations

from types import SimpleNamespace

from protos import frontend_pb2
from scheduler_svc.wire import request_from_embed_input, request_from_generate
from server.deps import tenant_salt, tenant_tag
from server.protocol import CompletionRequest
from server.sampling import ChoiceOptions, generate_request

KEY = "sk-a-very-secret-key"
TENANT_ID = "0123456789abcdef"  # what deps.tenant derives from a key


def test_the_tag_tells_tenants_apart_and_gives_nothing_away() -> None:
    tag = tenant_tag(TENANT_ID)
    assert len(tag) == 16 and int(tag, 16) >= 0
    assert tag == tenant_tag(TENANT_ID) and tag != tenant_tag("fedcba9876543210")
    assert TENANT_ID not in tag and KEY not in tag
    assert tag not in tenant_salt(TENANT_ID, None)  # not the input the cache salts use
    assert tenant_tag("") == ""  # an open server is one tenant


def test_the_tag_rides_on_every_generate_request_onto_the_ledgers_request() -> None:
    body = CompletionRequest(model="m", prompt="x", max_tokens=3, priority=2)
    model = SimpleNamespace(name="m")
    wire = generate_request(
        body,
        model,
        [5, 6, 7],
        3,
        "salt",
        tenant_tag(TENANT_ID),
        "cmpl-1-0",
        0,
        ChoiceOptions("cmpl", 3),
    )
    assert wire.tenant == tenant_tag(TENANT_ID)
    wire = frontend_pb2.GenerateRequest.FromString(wire.SerializeToString())
    core = request_from_generate(wire, [2])
    assert core.tenant == tenant_tag(TENANT_ID)
    assert (core.request_id, core.prompt_token_ids, core.max_tokens) == ("cmpl-1-0", [5, 6, 7], 3)
    assert (core.priority, core.cache_salt, core.eos_token_ids) == (2, "salt", frozenset({2}))
    assert request_from_generate(frontend_pb2.GenerateRequest(), []).tenant == ""
    embed = request_from_embed_input("e-0", [1, 2], "t")
    assert embed.tenant == "t" and embed.is_embedding and embed.max_tokens == 0
