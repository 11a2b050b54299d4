"""Whether a deployment file's KVLEDGER_* value only restates its flag's default.

docker-compose.yml and deploy/k8s/ set only what differs from the default, so a changed default
is not silently pinned by a deployment file; PINNED names the values other parts of those files
depend on (ports that probes, Services and scrape targets name; the model the frontend waits
for)."""

from __future__ import annotations

from kvledger.config.worker import CPU_KV_CACHE_BYTES
from kvledger.flag_values import env_default
from kvledger.flags import flags_for
from worker.device_defaults import choose


def effective_defaults(env: dict[str, str]) -> dict[str, object]:
    """What flags defaulting to None stand for on the worker this environment configures
    (kvledger/config/worker.py, worker/device_defaults.py; the CUDA image carries flash-attn)."""
    device = env.get("KVLEDGER_DEVICE", "cpu")
    chosen = choose(device, None, None, "auto", flash_installed=True)
    out: dict[str, object] = {
        "KVLEDGER_DTYPE": chosen.dtype,
        "KVLEDGER_BLOCK_SIZE": chosen.block_size,
    }
    if not device.startswith("cuda"):
        out["KVLEDGER_KV_CACHE_MEMORY_BYTES"] = CPU_KV_CACHE_BYTES
    return out


PINNED = {
    "KVLEDGER_PORT",
    "KVLEDGER_GRPC_PORT",
    "KVLEDGER_METRICS_PORT",
    "KVLEDGER_MODEL",
    "KVLEDGER_SERVED_MODEL_NAME",
}


def restated_defaults(service: str, env: dict[str, str]) -> list[str]:
    """The variables of `env` that restate a default (read as the flag reads them) and are not
    PINNED."""
    flags = {f.env_var: f for f in flags_for(service)}
    effective = effective_defaults(env)
    return [
        key
        for key, value in env.items()
        if key not in PINNED
        and key in flags
        and value is not None
        and env_default(flags[key], {key: value}) == effective.get(key, flags[key].default)
    ]
