import pytest


@pytest.fixture(params=[True, False], ids=["kv", "no_kv"])
def kv(request: pytest.FixtureRequest) -> bool:
    """Every scheduler path runs with the KV-cache manager and with the no-KV manager."""
    return request.param
