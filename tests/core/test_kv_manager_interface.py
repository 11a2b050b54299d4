import inspect

from scheduler_svc.core.kv_cache_interface import KVManager
from scheduler_svc.core.kv_cache_manager import KVCacheManager
from scheduler_svc.core.no_kv_cache_manager import NoKVCacheManager


def public_api(cls: type) -> dict[str, str]:
    api = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            api[name] = "property -> " + str(inspect.signature(member.fget).return_annotation)
        elif callable(member):
            api[name] = str(inspect.signature(member))
    return api


def test_both_managers_expose_exactly_the_same_public_methods() -> None:
    kv, no_kv = public_api(KVCacheManager), public_api(NoKVCacheManager)
    assert kv == no_kv
    assert kv == public_api(KVManager)
    assert {"allocate_for_admission", "allocate_slots", "free", "find_cached_prefix"} <= set(kv)


def test_both_managers_implement_every_abstract_method() -> None:
    assert not inspect.isabstract(KVCacheManager)
    assert not inspect.isabstract(NoKVCacheManager)
