"""Server-wide settings, resolved once: command-line flags > BATCHSERVE_* environment > defaults.

Per-model settings live in each model's config.pbtxt, never here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from batchserve.core.backend_config import parse_backend_config
from batchserve.core.budgets import BudgetSpec, parse_budget, parse_budgets
from batchserve.core.cache_config import parse_cache_config
from batchserve.core.device import DeviceKind
from batchserve.core.metrics_config import MetricsConfig, parse_metrics_config
from batchserve.core.rate_limit import (
    RATE_LIMIT_MODES,
    ExplicitResources,
    parse_rate_limit_resources,
)
from batchserve.core.request_memory import DEFAULT_SHARE
from batchserve.core.restrictions import GRPC_HEADER_PREFIX, Restriction, parse_restrictions
from batchserve.core.tls import TlsFiles
from batchserve.core.trace_config import parse_trace_config

MIB = 1024 * 1024
CpuScheduling = Literal["batch", "normal"]
"""Policies the server may put its threads under (``runtime/cpu_scheduling.py``)."""
INT32_MAX = 2**31 - 1
"""grpc core reads its channel arguments as 32-bit integers."""
MAX_PORT = 65535
LOG_LEVELS = ("debug", "info", "warning", "error")
"""The ``--log-level`` values: Triton's verbose (debug), info, warning and error switches."""
ALL_MODELS = "*"
"""``--load-model *``: every model in the repository (Triton's), alone of its flag."""
TRUE_WORDS = ("true", "on", "1")
FALSE_WORDS = ("false", "off", "0")
"""How a boolean flag may be written, in any case: the words Triton's parser accepts."""


_RESTRICTION_OPTIONS = {
    "http_restricted_api": ("--http-restricted-api", "api", ""),
    "grpc_restricted_protocol": ("--grpc-restricted-protocol", "protocol", GRPC_HEADER_PREFIX),
}
"""Each restriction field's flag, what Triton calls its groups' members, and the prefix of
the header a request carries."""


_CONFIG_PARSERS: Mapping[str, Callable[[Sequence[str]], object]] = {
    "backend_config": parse_backend_config,
    "trace_config": parse_trace_config,
    "cache_config": parse_cache_config,
    "metrics_config": parse_metrics_config,
    "rate_limit_resource": parse_rate_limit_resources,
}
"""Triton's repeatable ``--*-config`` options, each read by its own module."""


def _restrictions(field: str, groups: tuple[str, ...]) -> Mapping[str, Restriction]:
    """The groups of one restriction field, parsed (ValueError in Triton's words)."""
    option, kind, header_prefix = _RESTRICTION_OPTIONS[field]
    return parse_restrictions(groups, option=option, kind=kind, header_prefix=header_prefix)


def plain_config_name(name: str) -> str:
    """``name`` if it can be ``--model-config-name``: a file name in each model's configs/
    folder. Triton refuses an empty one and spaces; a path could leave the model's directory."""
    odd = any(c.isspace() or c in "/\\" or not c.isprintable() for c in name)
    if not name or name.startswith(".") or odd:
        raise ValueError(
            "--model-config-name must name a file in each model's configs/ folder: not "
            f"empty, no spaces, '/' or '\\', and not starting with '.', not {name[:64]!r}"
        )
    return name


class ModelControlMode(StrEnum):
    """Triton's names: `none` loads everything at start and forbids changes; `explicit`
    loads what `--load-model` names and opens the repository load/unload API; `poll` loads
    everything at start, then follows the repository's changes every
    `--repository-poll-secs` (``models/repository_poll.py``)."""

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


class ClientShm(StrEnum):
    """Who may register shared-memory regions. Only a client on this host can share memory
    with the server, so `local` (the default) admits loopback clients and refuses remote ones,
    which could only probe the host's memory; `false` refuses all (Triton's default), `true`
    admits all (Triton's `--allow-client-shm=true`)."""

    FALSE = "false"
    LOCAL = "local"
    TRUE = "true"


class Settings(BaseSettings):
    """Everything the server needs to start; frozen so it can be passed around freely."""

    model_config = SettingsConfigDict(env_prefix="BATCHSERVE_", frozen=True, extra="forbid")

    model_repository: Annotated[tuple[Path, ...], NoDecode] = (Path("model_repo"),)
    """Triton's ``--model-repository``, repeatable: the server serves the models of every
    repository given, a name found in two of them in none (``models/repository.py``). A
    variable (``BATCHSERVE_MODEL_REPOSITORY``) names one."""
    model_config_name: str | None = None
    """Triton's ``--model-config-name``: each model reads ``<model>/configs/<name>.pbtxt``
    where that file exists, else its ``config.pbtxt``."""
    disable_auto_complete_config: bool = False
    """Triton's ``--disable-auto-complete-config`` (``--strict-model-config true`` before it):
    a config must then list every input and output with data_type and dims, and keeps
    ``max_batch_size`` as written; nothing is filled in from the model file."""
    host: str = "127.0.0.1"
    server_id: str = Field("triton", min_length=1, max_length=256)
    """Triton's ``--id``: the name the server metadata answers with. Triton's own by
    default: NVIDIA's health and metadata examples fail on any other (the version says
    which server this is)."""
    http_address: str | None = None
    grpc_address: str | None = None
    metrics_address: str | None = None
    """Triton's ``--http-address``, ``--grpc-address`` and ``--metrics-address``: where one
    listener differs from ``host``; the metrics port follows the HTTP address unless given
    its own, as in Triton."""
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    """0 picks a free port. A port is checked only where its protocol is served: Triton
    starts with ``--http-port -47 --allow-http 0`` (``_served_ports``)."""
    metrics_interval_ms: int = Field(1000, gt=0, le=INT32_MAX)
    """Triton's ``--metrics-interval-ms``. Every series is read when scraped (and workers are
    asked for theirs then), so no value is older than the scrape; this is how often each
    worker also reports its counts unasked, which a scrape falls back on when a worker is
    slow to answer."""
    allow_metrics: bool = True
    """Triton's ``--allow-metrics``: false serves no metrics port at all."""
    allow_gpu_metrics: bool = True
    """Triton's ``--allow-gpu-metrics``: false reads no GPU through NVML for metrics (no GPU
    series, batchserve's or Triton's); GPUs still run models."""
    allow_cpu_metrics: bool = True
    """Triton's ``--allow-cpu-metrics``: false leaves out the host's CPU and memory series."""
    allow_http: bool = True
    allow_grpc: bool = True
    """Triton's ``--allow-http`` and ``--allow-grpc``: false serves no port for that protocol
    (its port then clashes with nothing); KServe's Triton runtime passes both true."""
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    load_model: tuple[str, ...] = ()
    strict_readiness: bool = True
    """Triton's ``--strict-readiness``: false reports the server ready while it serves, even
    with models not ready (each model's own readiness still says which)."""
    exit_on_error: bool = False
    """Triton's ``--exit-on-error``: true stops the server when a model it loads at start
    fails. Triton's default is true; batchserve's is to serve the others, not ready."""
    repository_poll_secs: int = Field(15, ge=0, le=24 * 3600)
    """Triton's ``--repository-poll-secs``: with ``--model-control-mode poll``, seconds
    between two reads of the repository (0: none after the start)."""
    control_token: str | None = None
    max_json_body_bytes: int = Field(16 * MIB, gt=0)
    max_binary_body_bytes: int = Field(64 * MIB, gt=0)
    http_max_input_size: int | None = Field(None, gt=0)
    """Triton's ``--http-max-input-size``, its one limit on a request's size: given, it is
    the default of both limits above (each still set apart by its own flag)."""
    max_queue_size: int = Field(1024, gt=0)
    wait_out_queue_delay: bool = False
    """Every model's batches wait out their whole queue delay, as in Triton
    (``scheduler/dispatch_timing.py``); a config turns it on for its model alone."""
    delay_scheduler: int = Field(0, ge=0)
    """For tests, Triton's ``TRITONSERVER_DELAY_SCHEDULER``: each batcher forms no batch until
    this many requests are queued, once, so a test's requests are queued together first."""
    backlog_delay_scheduler: int = Field(0, ge=0)
    """With ``delay_scheduler``, Triton's ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``: a sequence
    model's hold also lasts until this many requests wait in its backlog."""
    # The --memory-budget text in, its parsed budget per device kind out (NoDecode: the
    # environment variable's text is the flag's syntax, not JSON).
    memory_budget: Annotated[dict[DeviceKind, BudgetSpec], NoDecode] = Field(
        default=None, validate_default=True
    )
    max_request_memory: Annotated[BudgetSpec, NoDecode] = DEFAULT_SHARE
    """Bytes of requests and answers in flight, shared by the request-handling processes
    (``core/request_memory.py``): a fraction of the memory or a size, as a budget is."""
    busy_poll_us: int = Field(0, ge=0, le=100_000)
    cpu_scheduling: CpuScheduling = "batch"
    """Linux scheduling policy of the server's threads (``runtime/cpu_scheduling.py``)."""
    shutdown_delay_seconds: float = Field(0.0, ge=0)
    shutdown_timeout_seconds: float = Field(30.0, gt=0)
    # As Apache mod_reqtimeout's header=20 body=20,MinRate=500.
    http_header_timeout_seconds: float = Field(20.0, gt=0, le=3600)
    http_body_timeout_seconds: float = Field(20.0, gt=0, le=3600)
    http_body_min_rate: float = Field(500.0, gt=0)
    http_send_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    log_level: str = "info"
    log_format: str = Field("json", pattern="^(json|text|default|ISO8601)$")
    log_verbose: int | None = Field(None, ge=0, le=2**32 - 1)
    """Triton's ``--log-verbose``: above 0, debug messages are written too; 0, not. Unset,
    ``log_level`` decides."""
    log_file: Path | None = None
    """Triton's ``--log-file``: the logs go to this file, appended to, instead of stderr."""
    log_info: bool | None = None
    log_warning: bool | None = None
    log_error: bool | None = None
    """Triton's ``--log-info``, ``--log-warning`` and ``--log-error``: each level's messages
    on or off, over what ``log_level`` says."""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    """Triton's ``--reuse-*-port``: other processes may bind the port too (SO_REUSEPORT)."""
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    """Triton's gRPC-only TLS flags: with ``--grpc-use-ssl`` (or ``-mutual``, which requires
    a client certificate signed by ``--grpc-root-cert``) gRPC serves TLS with these files,
    whatever the ``--tls-*`` files say for HTTP."""
    allow_client_shm: ClientShm = ClientShm.LOCAL
    # gRPC connections, in milliseconds as Triton's --grpc-keepalive-* flags take them.
    grpc_handshake_timeout_ms: int = Field(20_000, gt=0, le=INT32_MAX)
    grpc_max_connection_idle_ms: int = Field(120_000, gt=0, le=INT32_MAX)
    grpc_keepalive_time_ms: int = Field(60_000, gt=0, le=INT32_MAX)
    grpc_keepalive_timeout_ms: int = Field(20_000, gt=0, le=INT32_MAX)
    # The rest of Triton's keepalive set, with grpc core's (and Triton's) defaults: pings a
    # client may send with no call open, and how often, before it gets GOAWAY.
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = Field(2, ge=0, le=INT32_MAX)
    grpc_http2_min_recv_ping_interval_without_data_ms: int = Field(300_000, ge=0, le=INT32_MAX)
    grpc_http2_max_ping_strikes: int = Field(2, ge=0, le=INT32_MAX)
    # None: connections live as long as they are used (Triton's "undefined").
    grpc_max_connection_age_ms: int | None = Field(None, gt=0, le=INT32_MAX)
    grpc_max_connection_age_grace_ms: int | None = Field(None, ge=0, le=INT32_MAX)
    grpc_max_concurrent_calls: int = Field(10_000, gt=0, le=INT32_MAX)
    grpc_accept_pipelines: int = Field(16, ge=0, le=1024)
    """Requests for the next inference call kept outstanding beyond grpc.aio's one
    (``grpc/accepts.py``); 0: grpc.aio's own."""
    grpc_infer_response_compression_level: Literal["none", "low", "medium", "high"] = "none"
    """Triton's: gRPC responses compressed at this level, with an algorithm the client
    says it accepts (grpc core's default level, ``grpc/options.py``)."""
    grpc_infer_thread_count: int | None = None
    http_thread_count: int | None = None
    """Triton's thread counts, taken so that its command lines run: batchserve's front ends
    are event loops (``--workers`` spreads them over processes), so they set nothing."""
    http_header_forward_pattern: str | None = None
    grpc_header_forward_pattern: str | None = None
    """Triton's patterns of the headers it forwards to backends as request parameters:
    checked, and changing nothing, as no built-in backend reads request parameters."""
    workers: str = Field("auto", pattern=r"^(auto|[1-9][0-9]{0,2})$")
    """Request-handling processes: ``auto`` (from ``cpus``) or a number; 1 serves everything
    in one process."""
    worker_timeout_seconds: float = Field(30.0, ge=0, le=3600)
    """A worker whose event loop answers none of the model-owning process's checks for this
    long is killed and replaced (0: never), as uvicorn's and gunicorn's supervisors do."""
    cpus: int | None = Field(None, ge=1, le=4096)
    """Cores the server may use; None: the process's CPU affinity bounded by its cgroup
    quota (``core/cpu_budget.py``)."""
    trace_config: tuple[str, ...] = ()
    """Triton's ``--trace-config`` entries (``core/trace_config.py``): the trace settings
    at start and where OpenTelemetry spans go."""
    cache_config: tuple[str, ...] = ()
    """Triton's ``--cache-config`` entries (``core/cache_config.py``): the size of its local
    response cache."""
    backend_config: tuple[str, ...] = ()
    """Triton's ``--backend-config`` entries (``core/backend_config.py``): a completed
    config's default batch size."""
    rate_limit: str = "off"
    """Triton's ``--rate-limit``: ``execution_count`` runs a batch only once its instance
    holds the resources its group's ``rate_limiter`` names (``scheduler/rate_limiter.py``);
    ``off`` ignores them, Triton's default."""
    rate_limit_resource: tuple[str, ...] = ()
    """Triton's ``--rate-limit-resource`` entries (``core/rate_limit.py``)."""
    metrics_config: tuple[str, ...] = ()
    """Triton's ``--metrics-config`` entries (``core/metrics_config.py``): the latency
    families of the ``nv_*`` metrics."""
    http_restricted_api: tuple[str, ...] = ()
    grpc_restricted_protocol: tuple[str, ...] = ()
    """Triton's ``--http-restricted-api`` and ``--grpc-restricted-protocol`` groups
    (``core/restrictions.py``): endpoints answered only with a header's value."""

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _parse_budgets(cls, value: object) -> object:
        """Parsed once, here: a bad budget stops the server before it starts. Anything but
        text (a mapping already parsed) is left to the field's type."""
        return parse_budgets(value) if value is None or isinstance(value, str) else value

    @field_validator("max_request_memory", mode="before")
    @classmethod
    def _parse_request_memory(cls, value: object) -> object:
        return parse_budget(value) if isinstance(value, str) else value

    @field_validator("http_max_input_size", mode="before")
    @classmethod
    def _positive_input_size(cls, value: object) -> object:
        """A size of 0 or less refused in Triton's words (its L0_http reads them in the
        server's log); anything else is left to the field's type and bound."""
        text = str(value).strip()
        if text.lstrip("-").isdigit() and int(text) <= 0:
            raise ValueError("Error: --http-max-input-size must be greater than 0.")
        return value

    @field_validator("model_repository", mode="before")
    @classmethod
    def _repositories(cls, value: object) -> object:
        """One path (a variable's, or a caller's) or several (the flag given again), each
        kept once, in the order given."""
        if isinstance(value, (str, Path)):
            return (Path(value),)
        if isinstance(value, (list, tuple)) and all(isinstance(p, (str, Path)) for p in value):
            return tuple(dict.fromkeys(Path(path) for path in value))
        return value

    @field_validator("model_repository")
    @classmethod
    def _some_repository(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        if not value:
            raise ValueError("at least one model repository is needed")
        return value

    @field_validator("grpc_infer_response_compression_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("grpc_infer_thread_count")
    @classmethod
    def _infer_threads_in_tritons_range(cls, value: int | None) -> int | None:
        if value is not None and not 2 <= value <= 128:
            raise ValueError(
                "invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128."
            )
        return value

    @field_validator("http_header_forward_pattern", "grpc_header_forward_pattern")
    @classmethod
    def _a_pattern(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("load_model")
    @classmethod
    def _all_models_alone(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if ALL_MODELS in value and len(value) > 1:
            raise ValueError(f"--load-model '{ALL_MODELS}' (every model) must be the only one")
        return value

    @field_validator("model_config_name")
    @classmethod
    def _plain_config_name(cls, value: str | None) -> str | None:
        return None if value is None else plain_config_name(value)

    def http_host(self) -> str:
        return self.http_address or self.host

    def grpc_host(self) -> str:
        return self.grpc_address or self.host

    def metrics_host(self) -> str:
        return self.metrics_address or self.http_host()

    def log_switches(self) -> dict[str, bool | int]:
        """Triton's log switches given at start, by their names in Triton's logging API."""
        given = {
            "log_verbose_level": self.log_verbose,
            "log_info": self.log_info,
            "log_warning": self.log_warning,
            "log_error": self.log_error,
        }
        return {key: value for key, value in given.items() if value is not None}

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        """Refused here: logging would otherwise fall back to info without a word."""
        level = value.lower()
        if level not in LOG_LEVELS:
            accepted = ", ".join(LOG_LEVELS[:-1]) + f" or {LOG_LEVELS[-1]}"
            raise ValueError(f"--log-level must be {accepted}, not {value[:32]!r}")
        return level

    @field_validator("rate_limit")
    @classmethod
    def _rate_limit_mode(cls, value: str) -> str:
        mode = value.lower()
        if mode not in RATE_LIMIT_MODES:
            raise ValueError("invalid argument for --rate-limit")
        return mode

    def rate_limit_resources(self) -> ExplicitResources:
        """What ``--rate-limit-resource`` said."""
        return parse_rate_limit_resources(self.rate_limit_resource)

    @field_validator(
        "trace_config", "cache_config", "metrics_config", "backend_config", "rate_limit_resource"
    )
    @classmethod
    def _config_entries_parse(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        """Refused here, naming the entry, rather than when first used."""
        _CONFIG_PARSERS[str(info.field_name)](value)
        return value

    def cache_bytes(self) -> int:
        """The response cache's size (0: none)."""
        return parse_cache_config(self.cache_config)

    def metrics(self) -> MetricsConfig:
        """What ``--metrics-config`` said."""
        return parse_metrics_config(self.metrics_config)

    @field_validator("http_restricted_api", "grpc_restricted_protocol")
    @classmethod
    def _restrictions_parse(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        """Refused here, in Triton's words, so a server never starts open by mistake."""
        _restrictions(str(info.field_name), value)
        return value

    def http_restrictions(self) -> Mapping[str, Restriction]:
        """The restricted HTTP APIs, by category."""
        return _restrictions("http_restricted_api", self.http_restricted_api)

    def grpc_restrictions(self) -> Mapping[str, Restriction]:
        """The restricted gRPC protocols, by category; headers as gRPC metadata keys."""
        return _restrictions("grpc_restricted_protocol", self.grpc_restricted_protocol)

    @field_validator("grpc_keepalive_permit_without_calls", mode="before")
    @classmethod
    def _triton_boolean(cls, value: object) -> object:
        """Triton's spellings of a boolean flag, refused by name otherwise."""
        if not isinstance(value, str):
            return value
        word = value.strip().lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise ValueError(
            f"--grpc-keepalive-permit-without-calls must be true or false (1 or 0), "
            f"not {value[:32]!r}"
        )

    @model_validator(mode="before")
    @classmethod
    def _one_input_size_for_both_bodies(cls, data: object) -> object:
        """Triton's single limit, under each body limit not given on its own. A size that
        is not a positive count is left to its field's own error, given once."""
        if not isinstance(data, dict):
            return data
        size = data.get("http_max_input_size")
        if not str(size).strip().isdigit() or int(str(size)) == 0:
            return data
        return {"max_json_body_bytes": size, "max_binary_body_bytes": size} | data

    @model_validator(mode="after")
    def _grace_follows_an_age(self) -> Settings:
        """A grace period alone would be accepted and do nothing: grpc core only starts it
        once a connection reaches its maximum age."""
        if self.grpc_max_connection_age_grace_ms is not None and (
            self.grpc_max_connection_age_ms is None
        ):
            raise ValueError(
                "--grpc-max-connection-age-grace needs --grpc-max-connection-age: the grace "
                "period starts when a connection reaches its maximum age"
            )
        return self

    @model_validator(mode="after")
    def _served_ports(self) -> Settings:
        """Each served protocol's port is a port; one not served may be anything."""
        ports = (("--http-port", self.http_port, self.allow_http),
                 ("--grpc-port", self.grpc_port, self.allow_grpc),
                 ("--metrics-port", self.metrics_port, self.allow_metrics))  # fmt: skip
        for flag, port, served in ports:
            if served and not 0 <= port <= MAX_PORT:
                raise ValueError(f"{flag} {port} is not a port: give 0 to {MAX_PORT}")
        return self

    @model_validator(mode="after")
    def _ports_apart(self) -> Settings:
        """Triton's check, in its words: two listeners may not share an address and port
        (with several workers both would bind it, and one protocol would answer the
        other's clients). A protocol not served takes no port, as in Triton."""
        listeners = []
        if self.allow_http:
            listeners.append(("HTTP", self.http_host(), self.http_port))
        if self.allow_grpc:
            listeners.append(("GRPC", self.grpc_host(), self.grpc_port))
        if self.allow_metrics:
            listeners.append(("metrics", self.metrics_host(), self.metrics_port))
        for index, (name, host, port) in enumerate(listeners):
            for other, other_host, other_port in listeners[index + 1 :]:
                if port and port == other_port and host == other_host:
                    raise ValueError(
                        f"The server cannot listen to {name} requests and {other} requests at "
                        f"the same address and port {host}:{port}"
                    )
        return self

    @model_validator(mode="after")
    def _tls_files_load(self) -> Settings:
        """Refuse to start with TLS half set up, or with files the listeners could not load."""
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("--tls-cert-file and --tls-key-file go together: give both or neither")
        if self.tls_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("--tls-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file")
        if self.tls is not None:
            self.tls.check()
        triton = self.grpc_use_ssl or self.grpc_use_ssl_mutual
        if triton and (self.grpc_server_cert is None or self.grpc_server_key is None):
            raise ValueError(
                "--grpc-use-ssl and --grpc-use-ssl-mutual need --grpc-server-cert and "
                "--grpc-server-key"
            )
        if self.grpc_use_ssl_mutual and self.grpc_root_cert is None:
            raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert, the clients' CA")
        if triton and self.grpc_tls is not None:
            self.grpc_tls.check()
        return self

    @property
    def tls(self) -> TlsFiles | None:
        """The HTTP listener's TLS files (and gRPC's, unless Triton's gRPC flags give its
        own: ``grpc_tls``), or None to serve in plain text."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        return TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    @property
    def grpc_tls(self) -> TlsFiles | None:
        """The gRPC listener's TLS files: Triton's ``--grpc-use-ssl*`` set, else ``tls``."""
        if not (self.grpc_use_ssl or self.grpc_use_ssl_mutual):
            return self.tls
        if self.grpc_server_cert is None or self.grpc_server_key is None:
            return None  # refused by ``_tls_files_load``
        return TlsFiles(
            self.grpc_server_cert, self.grpc_server_key, self.grpc_root_cert,
            clients_certified=self.grpc_use_ssl_mutual,
        )  # fmt: skip
