"""Flags: one declaration, env defaults, and `kvledger serve` handing each flag to its service."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from kvledger import children
from kvledger.flags import (
    CONFIGS,
    FLAGS,
    FRONTEND,
    SCHEDULER,
    WORKER,
    flags_for,
    parse,
    to_argv,
    to_env,
)
from kvledger.options import config_flags

# The flags of docs/design.md, "Contracts", by the service that takes them.
CONTRACT_FLAGS = {
    FRONTEND: {"--host", "--port", "--api-key"},
    SCHEDULER: {
        "--enable-prefix-caching",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--enable-chunked-prefill",
        "--debug-invariants",
    },
    WORKER: {
        "--model",
        "--served-model-name",
        "--block-size",
        "--max-model-len",
        "--num-kv-blocks",
        "--gpu-memory-utilization",
        "--dtype",
        "--seed",
    },
}


@pytest.mark.parametrize("service", [FRONTEND, SCHEDULER, WORKER])
def test_contract_flags_belong_to_their_service(service):
    names = {f.name for f in flags_for(service)}
    assert CONTRACT_FLAGS[service] <= names


def test_every_flag_reads_its_environment_variable(monkeypatch):
    monkeypatch.setenv("KVLEDGER_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("KVLEDGER_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("KVLEDGER_API_KEY", "k1,k2")
    monkeypatch.setenv("KVLEDGER_DEBUG_INVARIANTS", "1")
    sched = parse(SCHEDULER, [], "t")
    assert sched.max_num_seqs == 7
    assert sched.enable_prefix_caching is False
    assert sched.debug_invariants is True
    assert parse(FRONTEND, [], "t").api_key == ["k1", "k2"]
    assert parse(FRONTEND, ["--api-key", "only"], "t").api_key == ["only"]
    assert parse(SCHEDULER, ["--max-num-seqs", "3"], "t").max_num_seqs == 3


def test_default_ports_are_the_contract_s():
    assert parse(FRONTEND, [], "t").port == 8000
    sched = parse(SCHEDULER, [], "t")
    assert (sched.grpc_port, sched.metrics_port) == (50051, 9400)
    assert parse(WORKER, [], "t").metrics_port == 9401


@pytest.mark.parametrize("service", [FRONTEND, SCHEDULER, WORKER])
def test_serve_hands_each_flag_to_its_service_unchanged(service, monkeypatch):
    serve_argv = [
        "--port",
        "8123",
        "--api-key",
        "a",
        "--api-key",
        "b",
        "--no-enable-prefix-caching",
        "--max-num-seqs",
        "5",
        "--debug-invariants",
        "--model",
        "/m",
        "--dtype",
        "bfloat16",
        "--num-kv-blocks",
        "99",
        "--seed",
        "3",
        "--max-model-len",
        "512",
    ]
    serve_args = children.serve_parser().parse_args(serve_argv + ["--worker-auth-token", "s3"])
    argv = to_argv(serve_args, service)
    assert "a" not in argv and "s3" not in argv, "secrets never go on a command line"
    for name, value in to_env(serve_args, service).items():
        monkeypatch.setenv(name, value)
    handed = parse(service, argv, "t")
    for flag in flags_for(service):
        if flag.name in ("--scheduler", "--metrics-port"):
            continue  # serve sets these per process
        expected = getattr(serve_args, flag.dest)
        if flag.kind == "list":
            expected = expected or []
        assert getattr(handed, flag.dest) == expected, flag.name


def test_flag_names_are_unique():
    names = [f.name for f in FLAGS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("var", "value", "accepts"),
    [
        ("KVLEDGER_ENABLE_PREFIX_CACHING", "flase", "expected a boolean"),
        ("KVLEDGER_DEBUG_INVARIANTS", "maybe", "expected a boolean"),
        ("KVLEDGER_SCHEDULING_POLICY", "lifo", "expected one of fcfs, priority, fair"),
        ("KVLEDGER_MAX_NUM_SEQS", "abc", "expected an integer"),
        ("KVLEDGER_WORKER_STEP_TIMEOUT", "soon", "expected a number"),
        ("KVLEDGER_NUM_SCHEDULER_STEPS", "0", "expected a value >= 1"),
    ],
)
def test_a_bad_environment_value_stops_startup_naming_the_variable(
    var, value, accepts, monkeypatch, capsys
):
    monkeypatch.setenv(var, value)
    for build in (lambda: parse(SCHEDULER, [], "t"), lambda: children.serve_parser()):
        with pytest.raises(SystemExit) as stopped:
            build()
        assert stopped.value.code == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"{var}={value!r}" in line and accepts in line, line


def test_a_bounded_setting_refuses_a_value_outside_its_bounds_everywhere(capsys):
    """`option(ge=1)`: the flag, `serve`'s flag and the dataclass itself refuse 0."""
    from kvledger.config.scheduler import EngineConfig

    for build in (
        lambda: parse(SCHEDULER, ["--num-scheduler-steps", "0"], "t"),
        lambda: children.serve_parser().parse_args(["--num-scheduler-steps", "0"]),
    ):
        with pytest.raises(SystemExit) as stopped:
            build()
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert "--num-scheduler-steps: must be >= 1, got 0" in err, err
    with pytest.raises(ValueError, match="num_scheduler_steps must be >= 1, got 0"):
        EngineConfig(num_scheduler_steps=0)
    assert parse(SCHEDULER, ["--num-scheduler-steps", "1"], "t").num_scheduler_steps == 1
    assert {f.name: f for f in FLAGS}["--num-scheduler-steps"].bounds == ">= 1"


@pytest.mark.parametrize("word", ["0", "false", "No", "off", " OFF "])
def test_environment_booleans_read_false_words(word, monkeypatch):
    monkeypatch.setenv("KVLEDGER_ENABLE_PREFIX_CACHING", word)
    assert parse(SCHEDULER, [], "t").enable_prefix_caching is False


def test_environment_values_of_other_services_do_not_stop_a_service(monkeypatch):
    """A worker's variable is checked where it is a flag, not by every service that shares
    the environment (compose gives one env file to all)."""
    monkeypatch.setenv("KVLEDGER_DTYPE", "float64")
    assert parse(FRONTEND, [], "t").port == 8000
    with pytest.raises(SystemExit):
        parse(WORKER, [], "t")


@pytest.mark.parametrize("service", [SCHEDULER, WORKER])
def test_metrics_bind_loopback_by_default_like_every_other_port(service):
    assert parse(service, [], "t").metrics_host == "127.0.0.1"
    assert parse(FRONTEND, [], "t").host == "127.0.0.1"
    assert parse(SCHEDULER, [], "t").grpc_host == "127.0.0.1"


def test_a_secret_on_the_command_line_is_warned_about(capsys):
    parse(FRONTEND, ["--api-key", "key-value-1"], "t")
    parse(SCHEDULER, ["--worker-auth-token=token-value-2"], "t")
    err = capsys.readouterr().err
    assert "--api-key on the command line" in err and "KVLEDGER_API_KEY" in err
    assert "--api-keys-file" in err
    assert "--worker-auth-token on the command line" in err and "KVLEDGER_WORKER_AUTH_TOKEN" in err
    assert "value-1" not in err and "value-2" not in err, "the warning never repeats the secret"
    parse(FRONTEND, ["--port", "1"], "t")
    assert capsys.readouterr().err == ""


# ---- declared once: the config dataclasses are the flags ----


def _leaf_fields(cls) -> list[str]:
    """Every setting of a config dataclass: its fields, nested config groups opened."""
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            names += _leaf_fields(hint)
        else:
            names.append(f.name)
    return names


@pytest.mark.parametrize("service", [*CONFIGS, "serve"])
def test_every_config_field_has_exactly_one_flag_and_one_environment_variable(service):
    cls = CONFIGS.get(service, children.ServeSettings)
    flags = flags_for(service) if service in CONFIGS else children.SERVE_ONLY_FLAGS
    fields = _leaf_fields(cls)
    assert sorted(f.dest for f in flags) == sorted(fields)
    assert len(set(fields)) == len(fields), "a nested group hides a field"
    assert sorted(f.env_var for f in flags) == sorted("KVLEDGER_" + n.upper() for n in fields)


def test_a_flag_several_services_take_is_one_declaration():
    """Which services take a flag follows from which configs hold its field."""
    for flag in FLAGS:
        takers = {s for s, cls in CONFIGS.items() if flag.dest in _leaf_fields(cls)}
        assert flag.services == takers, flag.name
        if len(takers) > 1:
            assert flag.owner.startswith("kvledger.groups."), flag.name
    names = [f.name for f in [*FLAGS, *children.SERVE_ONLY_FLAGS]]
    assert len(names) == len(set(names))


def test_a_field_that_is_no_option_is_refused():
    @dataclasses.dataclass
    class Loose:
        stray: int = 3

    with pytest.raises(TypeError, match="stray"):
        config_flags(Loose)


def test_choices_come_from_where_the_names_live():
    from scheduler_svc.core.config import POLICIES
    from worker.attention import BACKENDS
    from worker.runner.setup import DTYPES

    by_name = {f.name: f for f in FLAGS}
    assert by_name["--scheduling-policy"].choices == POLICIES
    assert by_name["--attention-backend"].choices == BACKENDS
    assert set(by_name["--dtype"].choices) == {"auto", *DTYPES}


def test_the_ledgers_defaults_are_the_core_s():
    from kvledger.config.scheduler import EngineConfig
    from scheduler_svc.core.config import SchedulerConfig

    core = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}
    shared = [f for f in dataclasses.fields(EngineConfig) if f.name in core]
    assert len(shared) == 6
    for f in shared:
        assert f.default == core[f.name], f.name


def test_serve_and_the_configs_load_without_torch_grpc_or_the_web_framework():
    code = (
        "import sys, kvledger.cli, kvledger.flags;"
        "print(sorted(m for m in ('torch', 'grpc', 'fastapi', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_serve_s_own_environment_values_are_checked_like_flags(monkeypatch, capsys):
    monkeypatch.setenv("KVLEDGER_NUM_WORKERS", "two")
    with pytest.raises(SystemExit) as stopped:
        children.serve_parser()
    assert stopped.value.code == 2
    assert "KVLEDGER_NUM_WORKERS='two': expected an integer" in capsys.readouterr().err
