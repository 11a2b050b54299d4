"""`kvledger serve` hands every child every flag it takes: serve's own value (secrets through the
environment), or one of the named exceptions of kvledger/children.py."""

from __future__ import annotations

import os
import time
from collections import Counter

from prometheus_client import CollectorRegistry, Gauge

from kvledger import children, cli
from kvledger.flag_values import fill_list_defaults, flag_argv
from kvledger.flags import FLAGS, FRONTEND, SCHEDULER, WORKER, flags_for, parse
from kvledger.metrics_http import start_metrics_server
from tests.serving import free_port


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
            "--kv-cache-dtype",
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
        serve_args = children.serve_parser().parse_args(argv)
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
    args = children.serve_parser().parse_args(["-tp", "2", "--num-workers", "2"])
    fill_list_defaults(args, [*FLAGS, *children.SERVE_ONLY_FLAGS])
    specs = children.plan(args)
    by_name = {spec.name: parse(spec.service, spec.argv, "t") for spec in specs}
    assert by_name["worker-0"].tensor_parallel_size == by_name["worker-1"].tensor_parallel_size
    assert by_name["worker-1"].tensor_parallel_size == 2
    assert by_name["embed-0"].tensor_parallel_size == 1
    assert "-tp" not in specs[1].argv and "--tensor-parallel-size" in specs[1].argv


def test_serve_waits_for_every_worker_it_starts_by_model():
    """`--num-workers 2` means two workers of the model (a tensor-parallel worker counts once)
    and one embedding worker unless it is 'none'; their registrations are read from the
    scheduler's metrics, on loopback when it binds every address."""
    args = children.serve_parser().parse_args(["--num-workers", "2", "-tp", "2"])
    fill_list_defaults(args, [*FLAGS, *children.SERVE_ONLY_FLAGS])
    assert children.expected_workers(args) == {args.model: 2, args.embedding_model: 1}
    assert children.scheduler_metrics_url(args) == "http://127.0.0.1:9400/metrics"
    argv = ["--served-model-name", "m", "--embedding-model", "none", "--metrics-host", "0.0.0.0"]
    args = children.serve_parser().parse_args([*argv, "--metrics-port", "9500"])
    fill_list_defaults(args, [*FLAGS, *children.SERVE_ONLY_FLAGS])
    assert children.expected_workers(args) == {"m": 1}
    assert children.scheduler_metrics_url(args) == "http://127.0.0.1:9500/metrics"


def test_serve_reads_workers_connected_from_a_live_metrics_endpoint():
    """What serve's readiness compares with expected_workers: the scheduler's gauge, per model,
    from a real Prometheus endpoint; nothing while the endpoint does not answer."""
    registry = CollectorRegistry()
    gauge = Gauge("kvledger_workers_connected", "w", ["model"], registry=registry)
    gauge.labels("tiny-llama").set(2)
    gauge.labels("embedder").set(0)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    assert cli._workers_connected(url) == {}
    server = start_metrics_server(port, "127.0.0.1", registry)
    try:
        connected = cli._workers_connected(url)
        assert connected == {"tiny-llama": 2, "embedder": 0}
        assert not Counter({"tiny-llama": 2}) - connected
        assert Counter({"tiny-llama": 2, "embedder": 1}) - connected == {"embedder": 1}
    finally:
        server.shutdown()
        server.server_close()


def test_serve_waits_past_its_timeout_only_while_a_kernel_build_writes(monkeypatch, tmp_path):
    """A worker compiling its kernels on a slow machine is progress: serve's readiness waits
    while a build directory under the cache was written within the grace period, and times
    out once it stops."""
    monkeypatch.setenv("KVLEDGER_CACHE_DIR", str(tmp_path))
    assert not cli._still_building()  # no build directory at all
    build = tmp_path / "torch_extensions" / "kvledger_quant_ops_0123"
    build.mkdir(parents=True)
    obj = build / "linear.o"
    obj.write_bytes(b"")
    assert cli._still_building()
    old = time.time() - cli.BUILD_GRACE_SECONDS - 1
    os.utime(obj, (old, old))
    os.utime(build, (old, old))
    assert not cli._still_building()

    monkeypatch.setattr(cli, "STARTUP_TIMEOUT_SECONDS", 0)
    # the build's last write ages past the grace period 1.5 s from now: serve waits that long
    recent = time.time() - cli.BUILD_GRACE_SECONDS + 1.5
    os.utime(obj, (recent, recent))
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert not cli._wait_ready(url, f"{url}/metrics", Counter(), [], {"signal": None})
    assert 1.0 <= time.monotonic() - started < 10
