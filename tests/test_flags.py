"""Flags: one declaration, env defaults, and `kvledger serve` handing each flag to its service."""

from __future__ import annotations

import pytest

from kvledger import cli
from kvledger.flags import (
    FLAGS,
    FRONTEND,
    SCHEDULER,
    WORKER,
    flags_for,
    parse,
    to_argv,
    to_env,
)

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
