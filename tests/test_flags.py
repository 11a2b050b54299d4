"""Flags: one declaration, env defaults, and `kvledger serve` handing each flag to its service."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from kvledger import children, cli
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
from kvledger.options import config_flags, fill_list_defaults, flag_argv

DESIGN_FLAGS = {
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
def test_design_flags_belong_to_their_service(service):
    names = {f.name for f in flags_for(service)}
    assert DESIGN_FLAGS[service] <= names


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


def test_default_ports_match_the_design():
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
    serve_args = cli._serve_parser().parse_args(serve_argv + ["--worker-auth-token", "s3"])
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
    ],
)
def test_a_bad_environment_value_stops_startup_naming_the_variable(
    var, value, accepts, monkeypatch, capsys
):
    monkeypatch.setenv(var, value)
    for build in (lambda: parse(SCHEDULER, [], "t"), lambda: cli._serve_parser()):
        with pytest.raises(SystemExit) as stopped:
            build()
        assert stopped.value.code == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"{var}={value!r}" in line and accepts in line, line


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
    from worker.model_runner import DTYPES

    by_name = {f.name: f for f in FLAGS}
    assert by_name["--scheduling-policy"].choices == POLICIES
    assert by_name["--attention-backend"].choices == BACKENDS
    assert set(by_name["--dtype"].choices) == {"auto", *DTYPES}


def test_the_ledgers_defaults_are_the_core_s():
    from scheduler_svc.config import EngineConfig
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
        cli._serve_parser()
    assert stopped.value.code == 2
    assert "KVLEDGER_NUM_WORKERS='two': expected an integer" in capsys.readouterr().err


# ---- kvledger serve hands every child every flag it takes ----


def _unusual(flag):
    """A value of this flag that is not its default."""
    if flag.kind == "bool":
        return not flag.default
    if flag.kind == "switch":
        return True
    if flag.kind == "list":
        return [f"{flag.dest}-1", f"{flag.dest}-2"]
    if flag.choices:
        return next(c for c in flag.choices if c != flag.default)
    if flag.type is int:
        return {"num_workers": 2, "metrics_port": 19400}.get(flag.dest, 7)
    if flag.type is float:
        return 0.25
    return f"{flag.dest}-value"


def test_the_per_process_flags_of_serve_are_these():
    set_per_process = {
        SCHEDULER: {"--metrics-port"},
        WORKER: {"--scheduler", "--metrics-port", "--worker-id", "--served-model-name"},
        children.EMBEDDING_WORKER: {
            "--scheduler",
            "--metrics-port",
            "--worker-id",
            "--served-model-name",
            "--model",
        },
        FRONTEND: {"--scheduler", "--require-model"},
    }
    left_at_default = {
        SCHEDULER: set(),
        WORKER: set(),
        children.EMBEDDING_WORKER: {
            "--block-size",
            "--num-kv-blocks",
            "--kv-cache-memory-bytes",
            "--gpu-memory-utilization",
            "--max-model-len",
            "--attention-backend",
            "--tensor-parallel-size",
            "--tokenizer",
        },
        FRONTEND: {"--metrics-port"},
    }
    assert set_per_process == children.SET_PER_PROCESS
    assert left_at_default == children.LEFT_AT_DEFAULT


def test_serve_forwards_every_flag_a_child_accepts(monkeypatch):
    """Every flag of every child: serve's own value (secrets through the environment), or one
    of the named exceptions above, computed per process or left at the child's default."""
    argv = [a for f in children.serve_flags() for a in flag_argv(f, _unusual(f))]
    with monkeypatch.context() as m:
        m.delenv("KVLEDGER_API_KEY", raising=False)
        serve_args = cli._serve_parser().parse_args(argv)
    specs = children.plan(serve_args)
    assert [(s.name, s.role) for s in specs] == [
        ("scheduler", SCHEDULER),
        ("worker-0", WORKER),
        ("worker-1", WORKER),
        ("embed-0", children.EMBEDDING_WORKER),
        ("frontend", FRONTEND),
    ]
    for spec in specs:
        secrets = {f.env_var: f for f in flags_for(spec.service) if f.secret}
        assert set(spec.env) <= set(secrets)
        for secret in spec.env.values():
            assert secret not in spec.argv, "secrets never go on a command line"
        with monkeypatch.context() as m:
            for name in secrets:
                m.delenv(name, raising=False)
            for name, value in spec.env.items():
                m.setenv(name, value)
            handed = parse(spec.service, spec.argv, "t")
        given = {a.split("=", 1)[0] for a in spec.argv if a.startswith("--")}
        for flag in flags_for(spec.service):
            value = getattr(handed, flag.dest)
            if flag.name in children.SET_PER_PROCESS[spec.role]:
                assert flag.name in given, (spec.name, flag.name)
            elif flag.name in children.LEFT_AT_DEFAULT[spec.role]:
                assert flag.name not in given, (spec.name, flag.name)
            else:
                assert value == getattr(serve_args, flag.dest), (spec.name, flag.name)
    address = f"{serve_args.grpc_host}:{serve_args.grpc_port}"
    worker1, embed = parse(WORKER, specs[2].argv, "t"), parse(WORKER, specs[3].argv, "t")
    assert (worker1.scheduler, worker1.metrics_port) == (address, 19402)
    assert worker1.worker_id == "worker_id-value-1"
    assert (embed.model, embed.served_model_name, embed.metrics_port) == (
        "embedding_model-value",
        "embedding_model-value",
        19403,
    )
    front = parse(FRONTEND, specs[-1].argv, "t")
    assert front.require_model == [
        "require_model-1",
        "require_model-2",
        "served_model_name-value",
        "embedding_model-value",
    ]


def test_tensor_parallel_size_has_vllms_short_name_and_skips_the_embedding_worker():
    """`-tp N` is `--tensor-parallel-size N`; serve hands it to each generative worker, while
    the embedding worker stays single-rank."""
    assert parse(WORKER, ["-tp", "2"], "t").tensor_parallel_size == 2
    assert parse(WORKER, [], "t").tensor_parallel_size == 1
    args = cli._serve_parser().parse_args(["-tp", "2", "--num-workers", "2"])
    fill_list_defaults(args, [*FLAGS, *children.SERVE_ONLY_FLAGS])
    specs = children.plan(args)
    by_name = {spec.name: parse(spec.service, spec.argv, "t") for spec in specs}
    assert by_name["worker-0"].tensor_parallel_size == by_name["worker-1"].tensor_parallel_size
    assert by_name["worker-1"].tensor_parallel_size == 2
    assert by_name["embed-0"].tensor_parallel_size == 1
    assert "-tp" not in specs[1].argv and "--tensor-parallel-size" in specs[1].argv
