"""`batchserve serve`: flags named as Triton names them, each also a BATCHSERVE_* variable."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from batchserve.core.settings import FALSE_WORDS, TRUE_WORDS, Settings

TRITON_PROGRAM = "tritonserver"
"""Triton's program name, which command lines written for its image begin with."""

# (flag, settings field, type, help); the environment variable is BATCHSERVE_<FIELD>.
FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    (
        "--model-config-name",
        "model_config_name",
        str,
        "each model's configuration is <model>/configs/NAME.pbtxt where that file exists, "
        "else its config.pbtxt (Triton's flag)",
    ),
    ("--host", "host", str, "address to listen on (default 127.0.0.1)"),
    (
        "--rate-limit",
        "rate_limit",
        str,
        "Triton's: execution_count runs an instance's batch only once it holds the resources "
        "its instance_group rate_limiter names, waiting in order of runs times priority; off "
        "(default) ignores rate_limiter",
    ),
    ("--id", "server_id", str, "the server's name in its metadata (Triton's flag; default triton)"),
    (
        "--http-address",
        "http_address",
        str,
        "the HTTP port's address (Triton's; unset: --host)",
    ),
    (
        "--grpc-address",
        "grpc_address",
        str,
        "the gRPC port's address (Triton's; unset: --host)",
    ),
    (
        "--metrics-address",
        "metrics_address",
        str,
        "the metrics port's address (Triton's flag; unset: the HTTP address)",
    ),
    ("--http-port", "http_port", int, "HTTP port (default 8000; 0 picks a free one)"),
    ("--grpc-port", "grpc_port", int, "gRPC port (default 8001)"),
    ("--metrics-port", "metrics_port", int, "Prometheus metrics port (default 8002)"),
    (
        "--metrics-interval-ms",
        "metrics_interval_ms",
        int,
        "milliseconds between a worker's own reports of its counts; a scrape asks every "
        "worker afresh, so no series is older than the scrape (default 1000; Triton's flag)",
    ),
    (
        "--model-control-mode",
        "model_control_mode",
        str,
        "none (default), explicit, or poll: load every model, then follow the repository's "
        "changes (Triton's modes)",
    ),
    (
        "--repository-poll-secs",
        "repository_poll_secs",
        int,
        "with --model-control-mode poll: seconds between two reads of the repository, "
        "Triton's (default 15; 0: none after the start)",
    ),
    ("--max-queue-size", "max_queue_size", int, "requests queued per model before 503"),
    (
        "--delay-scheduler",
        "delay_scheduler",
        int,
        "testing: each batcher forms no batch until N requests are queued, once (Triton's "
        "TRITONSERVER_DELAY_SCHEDULER, which its batcher tests set; default 0: none)",
    ),
    (
        "--backlog-delay-scheduler",
        "backlog_delay_scheduler",
        int,
        "testing, with --delay-scheduler: a sequence model's hold also lasts until N requests "
        "wait in its backlog (Triton's TRITONSERVER_BACKLOG_DELAY_SCHEDULER; default 0)",
    ),
    (
        "--max-json-body-bytes",
        "max_json_body_bytes",
        int,
        "largest JSON request body in bytes, decompressed; default 16 MiB, as JSON grows ~11x "
        "in memory",
    ),
    (
        "--max-binary-body-bytes",
        "max_binary_body_bytes",
        int,
        "largest binary-tensor request body or gRPC message in bytes, decompressed; default "
        "64 MiB, as Triton's --http-max-input-size",
    ),
    (
        "--http-max-input-size",
        "http_max_input_size",
        int,
        "Triton's one limit on a request in bytes: both limits above, where not given themselves",
    ),
    (
        "--memory-budget",
        "memory_budget",
        str,
        "memory per device for models: a fraction (0.9, the default) or a size (8GiB); "
        "or per kind: cpu=8GiB,gpu=0.9",
    ),
    (
        "--max-request-memory",
        "max_request_memory",
        str,
        "memory for requests and answers in flight, shared by the request-handling "
        "processes: a fraction of the memory (0.25, the default) or a size (4GiB); past it "
        "new requests get 503 / UNAVAILABLE",
    ),
    (
        "--busy-poll-us",
        "busy_poll_us",
        int,
        "microseconds the event loop keeps polling after a request instead of sleeping "
        "(0 turns it off)",
    ),
    (
        "--cpu-scheduling",
        "cpu_scheduling",
        str,
        "batch (default): the server's threads run under Linux's SCHED_BATCH policy and do not "
        "preempt one another on busy cores; normal: the policy it was started with",
    ),
    ("--shutdown-delay", "shutdown_delay_seconds", float, "seconds not-ready before draining"),
    (
        "--shutdown-timeout",
        "shutdown_timeout_seconds",
        float,
        "longest wait, in seconds, for HTTP clients to close their connections, then again "
        "for the accepted requests",
    ),
    (
        "--exit-timeout-secs",
        "shutdown_timeout_seconds",
        float,
        "as --shutdown-timeout (Triton's flag)",
    ),
    (
        "--http-header-timeout",
        "http_header_timeout_seconds",
        float,
        "seconds an HTTP client has to send a request line and headers, from connecting or "
        "from a later request's first byte (default 20)",
    ),
    (
        "--http-body-timeout",
        "http_body_timeout_seconds",
        float,
        "seconds an HTTP client has to send a request body, plus 1 per --http-body-min-rate "
        "bytes received (default 20)",
    ),
    (
        "--http-body-min-rate",
        "http_body_min_rate",
        float,
        "bytes per second of request body that earn an HTTP client more time (default 500)",
    ),
    (
        "--http-send-timeout",
        "http_send_timeout_seconds",
        float,
        "seconds an HTTP client may leave its answer untaken (the server's send buffer full) "
        "before the connection is aborted (default 60; nginx's send_timeout)",
    ),
    ("--log-level", "log_level", str, "debug, info (default), warning, error"),
    ("--log-format", "log_format", str, "json (default), text, or Triton's default or ISO8601"),
    (
        "--log-verbose",
        "log_verbose",
        int,
        "above 0: debug messages too; 0: none (Triton's flag; unset: --log-level decides)",
    ),
    (
        "--log-file",
        "log_file",
        Path,
        "write the logs to this file, appended to, instead of standard error (Triton's flag; "
        "the workers of --workers write to it too)",
    ),
    ("--tls-cert-file", "tls_cert_file", Path, "PEM certificate chain: HTTP and gRPC serve TLS"),
    ("--tls-key-file", "tls_key_file", Path, "PEM private key of --tls-cert-file (unencrypted)"),
    (
        "--tls-ca-file",
        "tls_ca_file",
        Path,
        "PEM CA certificates: HTTP and gRPC clients must present a certificate signed by one "
        "(mutual TLS)",
    ),
    (
        "--grpc-server-cert",
        "grpc_server_cert",
        Path,
        "Triton's: PEM certificate of the gRPC port, with --grpc-use-ssl",
    ),
    (
        "--grpc-server-key",
        "grpc_server_key",
        Path,
        "Triton's: PEM private key of --grpc-server-cert",
    ),
    (
        "--grpc-root-cert",
        "grpc_root_cert",
        Path,
        "Triton's: PEM CA of the gRPC clients' certificates, required with --grpc-use-ssl-mutual",
    ),
    (
        "--allow-client-shm",
        "allow_client_shm",
        str,
        "who may register system and CUDA shared-memory regions: local (default: clients "
        "on this host), true (any client) or false (none)",
    ),
    (
        "--grpc-handshake-timeout",
        "grpc_handshake_timeout_ms",
        int,
        "milliseconds a new gRPC connection has to finish its TLS and HTTP/2 handshake "
        "before it is closed (default 20000)",
    ),
    (
        "--grpc-max-connection-idle",
        "grpc_max_connection_idle_ms",
        int,
        "milliseconds a gRPC connection may stay without a call before the server sends "
        "GOAWAY (default 120000)",
    ),
    (
        "--grpc-keepalive-time",
        "grpc_keepalive_time_ms",
        int,
        "milliseconds between the server's keepalive pings on a gRPC connection with calls "
        "(default 60000)",
    ),
    (
        "--grpc-keepalive-timeout",
        "grpc_keepalive_timeout_ms",
        int,
        "milliseconds a gRPC peer has to answer a ping before its connection is closed "
        "(default 20000)",
    ),
    (
        "--grpc-keepalive-permit-without-calls",
        "grpc_keepalive_permit_without_calls",
        str,
        "true (or 1) lets gRPC clients send keepalive pings on a connection with no call "
        "open; with false (or 0, the default) such pings are strikes",
    ),
    (
        "--grpc-http2-max-pings-without-data",
        "grpc_http2_max_pings_without_data",
        int,
        "pings the server sends on a gRPC connection while no data or headers are sent "
        "(0: no limit; default 2)",
    ),
    (
        "--grpc-http2-min-recv-ping-interval-without-data",
        "grpc_http2_min_recv_ping_interval_without_data_ms",
        int,
        "milliseconds a gRPC client must leave between pings while no data is sent; a ping "
        "sooner is a strike (default 300000)",
    ),
    (
        "--grpc-http2-max-ping-strikes",
        "grpc_http2_max_ping_strikes",
        int,
        "bad pings a gRPC client may send before GOAWAY too_many_pings closes its "
        "connection (0: no limit; default 2)",
    ),
    (
        "--grpc-max-connection-age",
        "grpc_max_connection_age_ms",
        int,
        "milliseconds after which a gRPC connection gets GOAWAY, so clients reconnect and "
        "re-resolve (default: no limit)",
    ),
    (
        "--grpc-max-connection-age-grace",
        "grpc_max_connection_age_grace_ms",
        int,
        "milliseconds calls in flight may take to finish after --grpc-max-connection-age "
        "before the connection is closed (default: no limit)",
    ),
    (
        "--grpc-max-concurrent-calls",
        "grpc_max_concurrent_calls",
        int,
        "gRPC calls (a stream counts as one) served at once; more are refused with "
        "UNAVAILABLE (default 10000)",
    ),
    (
        "--grpc-accept-pipelines",
        "grpc_accept_pipelines",
        int,
        "inference calls grpc can hand the server in one event-loop pass beyond its own one "
        "(default 16; 0: grpc.aio's one at a time)",
    ),
    (
        "--grpc-infer-response-compression-level",
        "grpc_infer_response_compression_level",
        str,
        "none (default), low, medium or high: gRPC responses compressed at this level with "
        "an algorithm the client accepts (Triton's flag; it compresses inference responses "
        "only, batchserve every response)",
    ),
    (
        "--grpc-infer-thread-count",
        "grpc_infer_thread_count",
        int,
        "Triton's, 2 to 128, taken and ignored: gRPC is served by an event loop per process "
        "(see --workers)",
    ),
    (
        "--http-thread-count",
        "http_thread_count",
        int,
        "Triton's, taken and ignored: HTTP is served by an event loop per process (see --workers)",
    ),
    (
        "--http-header-forward-pattern",
        "http_header_forward_pattern",
        str,
        "Triton's: a regular expression of the HTTP headers forwarded to backends as request "
        "parameters; checked, and changing nothing, as no built-in backend reads them",
    ),
    (
        "--grpc-header-forward-pattern",
        "grpc_header_forward_pattern",
        str,
        "the same for gRPC metadata (Triton's flag)",
    ),
    (
        "--workers",
        "workers",
        str,
        "request-handling processes sharing the HTTP and gRPC ports, handing decoded requests "
        "to the one process that runs the models: a number, or auto (default: 1 on 2 cores or "
        "fewer, else one less than the cores, at most 8)",
    ),
    (
        "--worker-timeout",
        "worker_timeout_seconds",
        float,
        "seconds a worker's event loop may leave the model-owning process's checks unanswered "
        "before it is killed and replaced (default 30; 0: never)",
    ),
    (
        "--cpus",
        "cpus",
        int,
        "cores the server may use (default: the process's CPU affinity, bounded by its cgroup "
        "CPU quota); auto workers are sized from it",
    ),
)


METRICS_SWITCHES = (
    ("--allow-metrics", "allow_metrics", "false: no metrics port at all (default true)"),
    ("--allow-gpu-metrics", "allow_gpu_metrics",
     "false: no GPU series (batchserve_gpu_*, nv_gpu_*, nv_energy_consumption; default true)"),
    ("--allow-cpu-metrics", "allow_cpu_metrics",
     "false: no host CPU and memory series (nv_cpu_*; default true)"),
)  # fmt: skip
LOG_SWITCHES = tuple(
    (f"--log-{level}", f"log_{level}", f"{level} messages on or off (unset: --log-level decides)")
    for level in ("info", "warning", "error")
)
PORT_SWITCHES = (
    ("--reuse-http-port", "reuse_http_port",
     "true: other processes may serve the HTTP port too, the kernel spreading connections "
     "(SO_REUSEPORT); false (default): a port another process holds stops the start"),
    ("--reuse-grpc-port", "reuse_grpc_port", "the same for the gRPC port"),
)  # fmt: skip
GRPC_TLS_SWITCHES = (
    ("--grpc-use-ssl", "grpc_use_ssl",
     "true: the gRPC port serves TLS with --grpc-server-cert and --grpc-server-key, HTTP "
     "as --tls-* says"),
    ("--grpc-use-ssl-mutual", "grpc_use_ssl_mutual",
     "true: as --grpc-use-ssl, and a gRPC client must present a certificate signed by "
     "--grpc-root-cert"),
)  # fmt: skip
STARTUP_SWITCHES = (
    ("--strict-readiness", "strict_readiness",
     "false: the server is ready while it serves, even with models not ready (default true)"),
    ("--exit-on-error", "exit_on_error",
     "true: stop when a model loaded at start fails (default false; Triton's is true)"),
)  # fmt: skip
PROTOCOL_SWITCHES = (
    ("--allow-http", "allow_http", "false: serve no HTTP port, as Triton (default true)"),
    ("--allow-grpc", "allow_grpc", "false: serve no gRPC port, as Triton (default true)"),
)
BATCHING_SWITCHES = (
    ("--wait-out-queue-delay", "wait_out_queue_delay",
     "true: a batch short of a preferred size waits its model's whole "
     "max_queue_delay_microseconds, as in Triton (default false: it goes once no other "
     "request can be expected within the delay)"),
)  # fmt: skip
SWITCHES = (
    METRICS_SWITCHES
    + LOG_SWITCHES
    + STARTUP_SWITCHES
    + PROTOCOL_SWITCHES
    + PORT_SWITCHES
    + GRPC_TLS_SWITCHES
    + BATCHING_SWITCHES
)
"""On/off flags, BOOL each: Triton's, and batchserve's own beside them."""
REPEATED: tuple[tuple[str, str, str, str], ...] = (
    ("--model-repository", "model_repository", "DIR",
     "a model repository directory (default model_repo); given again, the models of every "
     "one are served, as Triton's, and a model found in two of them in none"),
    ("--model-store", "model_repository", "DIR", "as --model-repository (Triton's older flag)"),
    ("--trace-config", "trace_config", "[MODE,]SETTING=VALUE",
     "Triton's trace settings (repeatable): level=TIMESTAMPS, rate=N, count=N, "
     "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
     "opentelemetry,url=HOST:PORT/v1/traces, opentelemetry,resource=KEY=VALUE"),
    ("--cache-config", "cache_config", "local,size=BYTES",
     "Triton's response cache: local,size=BYTES of responses kept in memory, for the models "
     "whose config sets response_cache { enable: true }"),
    ("--backend-config", "backend_config", "[BACKEND,]SETTING=VALUE",
     "Triton's backend settings (repeatable): default-max-batch-size=N (for every backend, "
     "or onnxruntime,default-max-batch-size=N for one) is the batch size of a config "
     "completed from its model file (default 32); other settings are checked for their "
     "form and ignored, as batchserve's backends are built in"),
    ("--rate-limit-resource", "rate_limit_resource", "NAME:COUNT[:DEVICE]",
     "Triton's: how many of a resource named in instance_group rate_limiter the server has, "
     "on DEVICE or, without one, on every device (repeatable); without it, the most any one "
     "instance needs"),
    ("--metrics-config", "metrics_config", "SETTING=VALUE",
     "Triton's latency families of the nv_* metrics (repeatable): counter_latencies (true), "
     "summary_latencies (false), summary_quantiles=Q:E,..., histogram_latencies (false)"),
    ("--http-restricted-api", "http_restricted_api", "APIS:HEADER=VALUE",
     "Triton's: HTTP APIs (health, metadata, inference, shared-memory, model-config, "
     "model-repository, statistics, trace, logging; comma-separated) answered only to "
     "requests whose HEADER is VALUE, else 403 (repeatable, an API in one group only)"),
    ("--grpc-restricted-protocol", "grpc_restricted_protocol", "PROTOCOLS:KEY=VALUE",
     "Triton's: the same for gRPC, whose calls must carry the metadata "
     "triton-grpc-protocol-KEY: VALUE, else PERMISSION_DENIED (repeatable)"),
)  # fmt: skip
"""Triton's repeatable options (flag, settings field, metavar, help), each a list."""


def _triton_bool(text: str) -> bool:
    """A boolean flag's value as Triton reads it: true, on or 1; false, off or 0."""
    word = text.strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise argparse.ArgumentTypeError(f"must be true or false (1 or 0), not {text[:32]!r}")


def _pair(text: str) -> str:
    """Triton's ``<device>:<value>`` flags: a device number and a number."""
    device, colon, value = text.partition(":")
    try:
        int(device), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be <device>:<value>, not {text[:32]!r}") from None
    if not colon:
        raise argparse.ArgumentTypeError(f"must be <device>:<value>, not {text[:32]!r}")
    return text


IGNORED: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--backend-directory", str, "batchserve's backends are built in"),
    ("--repoagent-directory", str, "batchserve has no repository agents"),
    ("--cache-directory", str, "the local cache is built in"),
    ("--model-load-thread-count", int, "the server chooses how many instances load at once"),
    ("--model-load-retry-count", int, "a failed load is not retried"),
    ("--buffer-manager-thread-count", int, "inputs are copied on the event loop"),
    ("--pinned-memory-pool-byte-size", int, "pinned buffers are the runtimes' own"),
    ("--cuda-memory-pool-byte-size", _pair, "GPU memory is bounded by --memory-budget"),
    ("--cuda-virtual-address-size", _pair, "GPU memory is bounded by --memory-budget"),
    ("--model-load-gpu-limit", _pair, "GPU memory is bounded by --memory-budget"),
    ("--min-supported-compute-capability", float, "every GPU CUDA sees is used"),
    ("--grpc-infer-allocation-pool-size", int, "gRPC messages are not pooled"),
    ("--grpc-max-response-pool-size", int, "gRPC messages are not pooled"),
    ("--host-policy", str, "NUMA placement is left to the operating system"),
    ("--enable-peer-access", _triton_bool, "GPUs do not copy to one another"),
)
"""Triton's flags a command line written for its image may pass that change nothing
batchserve does (flag, how its value is checked, why): checked as Triton checks them and
ignored, each named in the start's log."""

DEPRECATED_TRACE: tuple[tuple[str, str, str], ...] = (
    ("--trace-file", "triton,file=", "triton,file=<filepath>"),
    ("--trace-level", "level=", "level=<OFF|TIMESTAMPS|TENSORS>"),
    ("--trace-rate", "rate=", "rate=<rate value>"),
    ("--trace-count", "count=", "count=<count value>"),
    (
        "--trace-log-frequency",
        "triton,log-frequency=",
        "triton,log-frequency=<log frequency value>",
    ),
)
"""Triton's older trace flags (flag, the --trace-config setting it is, as Triton's warning
names it): each read as that setting, before every --trace-config, with Triton's warning."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model repository over HTTP and gRPC",
        description="Serve a model repository (KServe v2 / Triton protocol).",
    )
    parser.add_argument(
        "program", nargs="?", default=None,  # checked in run(): see _stray_word
        help=f"'{TRITON_PROGRAM}', ignored: a command line written for Triton's image (KServe's "
        "Triton runtime passes 'tritonserver --model-store=... --allow-grpc=true ...') runs "
        "as it is",
    )  # fmt: skip
    for flag, field, kind, text in FLAGS:
        parser.add_argument(flag, dest=field, type=kind, default=None, help=text)
    parser.add_argument(
        "--disable-auto-complete-config", dest="disable_auto_complete_config",
        action="store_const", const=True, default=None,
        help="fill nothing into a model's config from its model file: the config must list "
        "every input and output with data_type and dims (Triton's flag)",
    )  # fmt: skip
    parser.add_argument(
        "--strict-model-config", dest="strict_model_config", type=_triton_bool,
        metavar="BOOL", default=None,
        help="true: as --disable-auto-complete-config; false: configs are completed from the "
        "model file, the default, unless --disable-auto-complete-config is given too, which "
        "wins (Triton's older flag, which NVIDIA's Model Analyzer passes)",
    )  # fmt: skip
    for flag, field, text in SWITCHES:
        parser.add_argument(
            flag, dest=field, type=_triton_bool, metavar="BOOL", default=None,
            help=f"{text} (Triton's flag)",
        )  # fmt: skip
    parser.add_argument(
        "--load-model", dest="load_model", action="append", default=None,
        help="with --model-control-mode explicit: a model to load at start (repeatable); "
        "'*' alone: every model in the repository",
    )  # fmt: skip
    for flag, field, metavar, text in REPEATED:
        parser.add_argument(
            flag, dest=field, action="append", default=None, metavar=metavar, help=text
        )
    for flag, check, why in IGNORED:
        parser.add_argument(
            flag, dest="ignored", action="append", default=None, metavar="VALUE",
            type=lambda value, flag=flag, check=check: (flag, check(value)),
            help=f"Triton's flag, accepted and ignored: {why}",
        )  # fmt: skip
    parser.add_argument(
        "--response-cache-byte-size", dest="response_cache_byte_size", type=int, default=None,
        help="Triton's older flag: as --cache-config local,size=BYTES",
    )  # fmt: skip
    parser.add_argument(
        "--model-namespacing", dest="model_namespacing", type=_triton_bool, metavar="BOOL",
        default=None, help="Triton's: false only (a model name is one model across every "
        "repository); true is refused",
    )  # fmt: skip
    for flag, setting, _ in DEPRECATED_TRACE:
        parser.add_argument(
            flag, dest="older_trace_flags", action="append", default=None, metavar="VALUE",
            type=lambda value, setting=setting: f"{setting}{value}",
            help=f"Triton's older flag: as --trace-config {setting}VALUE",
        )  # fmt: skip
    parser.set_defaults(handler=run)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags given on the command line win over BATCHSERVE_* variables, which win over defaults."""
    given = {field: getattr(args, field) for _, field, _, _ in FLAGS}
    # Triton's rule: --disable-auto-complete-config wins over a --strict-model-config false
    given["disable_auto_complete_config"] = args.disable_auto_complete_config or (
        args.strict_model_config
    )
    given.update({field: getattr(args, field) for _, field, _ in SWITCHES})
    if args.load_model is not None:
        given["load_model"] = tuple(args.load_model)
    for _, repeated, _, _ in REPEATED:
        if getattr(args, repeated) is not None:
            given[repeated] = tuple(getattr(args, repeated))
    if args.older_trace_flags is not None:
        given["trace_config"] = (*args.older_trace_flags, *(given.get("trace_config") or ()))
    if args.response_cache_byte_size is not None:  # Triton's older flag
        given["cache_config"] = (f"local,size={args.response_cache_byte_size}",)
    return Settings(**{k: v for k, v in given.items() if v is not None})


def settings_errors(error: ValidationError) -> list[str]:
    """One line per invalid setting, instead of pydantic's multi-line report."""
    lines = []
    for detail in error.errors(include_url=False):
        message = str(detail["msg"]).removeprefix("Value error, ")
        field = ".".join(str(part) for part in detail["loc"])
        lines.append(f"{field}: {message}" if field else message)
    return lines


def _stray_word(word: str) -> str:
    """A word where only Triton's program name may stand. Most often the value of a flag
    batchserve does not know (``--cache-config local,size=N``): argparse sets that flag
    aside and gives its value to the program word, where a list of choices used to name
    'tritonserver' as the only one, hiding the flag."""
    return (
        f"unrecognized arguments: {word} (only '{TRITON_PROGRAM}' may stand before the flags, "
        "and every flag is written --flag VALUE or --flag=VALUE)"
    )


def _refused_triton_flags(args: argparse.Namespace) -> str | None:
    """Why Triton's flags as given cannot start the server: its conflict, in its words, or
    a mode batchserve does not have."""
    if args.response_cache_byte_size is not None and args.cache_config is not None:
        return (
            "Error: Incompatible flags --response-cache-byte-size and --cache-config both "
            "provided. Please provide one or the other."
        )
    if args.model_namespacing:
        return (
            "--model-namespacing true: batchserve does not namespace models by repository; a "
            "model name is one model across every --model-repository"
        )
    return None


def _warn_of_older_flags(args: argparse.Namespace) -> None:
    """Triton's warnings for its older flags, in its words, before anything starts."""
    for flag, setting, shown in DEPRECATED_TRACE:  # Triton's warnings, in its words
        if any(given.startswith(setting) for given in args.older_trace_flags or ()):
            print(f"Warning: '{flag}' has been deprecated and will be removed in future "
                  f"releases. Please use '--trace-config {shown} instead.",
                  file=sys.stderr)  # fmt: skip
    if args.strict_model_config is not None:
        print("Warning: '--strict-model-config' has been deprecated! Please use "
              "'--disable-auto-complete-config' instead.", file=sys.stderr)  # fmt: skip
        if args.disable_auto_complete_config and not args.strict_model_config:
            print("Warning: Overriding deprecated '--strict-model-config' from False to True "
                  "in favor of '--disable-auto-complete-config'!", file=sys.stderr)  # fmt: skip
    if args.response_cache_byte_size is not None:
        size = args.response_cache_byte_size
        print("Warning: '--response-cache-byte-size' has been deprecated! This will default "
              "to the 'local' cache implementation with the provided byte size for its "
              "config. Please use '--cache-config' instead. The equivalent --cache-config "
              f"CLI args would be: '--cache-config=local,size={size}'",
              file=sys.stderr)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from batchserve.observability.logs import configure_logging
    from batchserve.runtime.app import run as run_server

    if args.program not in (None, TRITON_PROGRAM):
        print(f"batchserve serve: error: {_stray_word(args.program)}", file=sys.stderr)
        return 2
    refused = _refused_triton_flags(args)
    if refused is not None:
        print(f"batchserve serve: {refused}", file=sys.stderr)
        return 2
    _warn_of_older_flags(args)
    try:
        settings = settings_from_args(args)
    except ValidationError as error:
        for line in settings_errors(error):
            print(f"batchserve serve: {line}", file=sys.stderr)
        return 2
    try:
        configure_logging(
            settings.log_level, settings.log_format, settings.log_switches(), settings.log_file
        )
    except OSError as error:
        print(f"batchserve serve: --log-file: cannot open it: {error}", file=sys.stderr)
        return 2
    for flag, value in args.ignored or ():
        why = next(reason for name, _, reason in IGNORED if name == flag)
        logging.getLogger(__name__).info(
            "Triton flag accepted and ignored", extra={"flag": flag, "value": value, "why": why}
        )
    return run_server(settings)
