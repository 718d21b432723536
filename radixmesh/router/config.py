"""RouterConfig: every knob of the router, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument
from radixmesh.listener import ListenerLimits
from radixmesh.router.limits import RequestLimits
from radixmesh.router.openai.tool_parsers import PARSERS

TOOL_CALL_PARSERS = ("auto", *PARSERS)

DNS_PREFIX = "dns:"


@dataclass(frozen=True)
class RouterConfig:
    # Worker addresses, host:port; `dns:name:port` stands for every address the name
    # resolves to, re-resolved every `discovery_interval` (a headless Service's pods).
    workers: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 50050
    policy: str = "cache_aware"
    seed: int | None = None  # the policies' random tie-breaks; None: unseeded
    # Every summary together may hold this many bytes (accounted per block, see summary.py).
    summary_budget_bytes: int = 256 * 1024 * 1024
    tentative_ttl: float = 5.0  # seconds a routed prompt counts as cached before events
    # cache_aware: a queued or running request costs this many prefill tokens, and each
    # prompt token routed to a worker and not prefilled yet this much (router/policy.py).
    request_cost_tokens: int = 64
    pending_prefill_weight: float = 0.5
    health_interval: float = 1.0  # seconds between GetLoad polls of each worker
    health_timeout: float = 2.0
    breaker_failures: int = 3  # consecutive failures that open a worker's breaker
    breaker_cooldown: float = 5.0  # seconds an open breaker stays open before a trial
    max_attempts: int = 3  # workers a request may try when they fail before the first token
    # Program-aware routing (programs.py): a tagged program's requests stay on the worker
    # holding its prefix while it runs or queues fewer requests than this (0: off).
    program_max_queued: int = 32
    http_port: int | None = None  # the OpenAI-compatible HTTP API (None: off)
    # Unknown fields in OpenAI requests: False: logged and ignored; True: 400 naming them.
    strict_openai: bool = False
    # The tool-call syntax (router/openai/tool_parsers.py); auto: from the chat template.
    tool_call_parser: str = "auto"
    # Chat replies' `<think>...</think>` as reasoning_content by default (requests may say).
    separate_reasoning: bool = False
    metrics_port: int | None = None  # Prometheus /metrics (None: only on the HTTP port)
    # Open the gRPC and HTTP ports only once serving (a worker answered, the tokenizer is
    # loaded), instead of at once with health NOT_SERVING. For replicas sharing ports on
    # one host (SO_REUSEPORT): a starting or restarting replica must not take connections
    # that the kernel would otherwise hash to it and that it cannot serve yet.
    listen_when_serving: bool = False
    # Read each request's chunks on its own Generate call instead of the worker's output
    # stream (router/outputs.py), which carries every request's chunks per step.
    per_request_streams: bool = False
    # Clients must send `authorization: Bearer <one of these>` (empty: no authentication).
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # FlushCache, ClusterStatus and aborting another caller's request need one of these
    # (they are API keys too); empty: any API key may (or anyone, without API keys).
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    tls_cert: str | None = None  # PEM files; both set: gRPC and HTTP serve TLS
    tls_key: str | None = None
    # The key the router sends to workers started with `--api-key` (None: none sent).
    worker_api_key: str | None = field(default=None, repr=False)
    # The Hugging Face hub cache for the tokenizer of a hub model (None: huggingface_hub's).
    download_dir: str | None = None
    # With tls_cert/tls_key: clients must present a certificate this CA signed (mTLS).
    tls_client_ca: str | None = None
    # Router -> worker TLS: the CA that signed the workers' certificates (set: TLS), the
    # router's own certificate for workers that require one, and the name to check the
    # workers' certificates against when they are reached by IP address (DNS discovery).
    worker_tls_ca: str | None = None
    worker_tls_cert: str | None = None
    worker_tls_key: str | None = None
    worker_tls_server_name: str | None = None
    discovery_interval: float = 5.0  # seconds between look-ups of `dns:` worker names
    # Admission (router/admission.py): requests on the workers at once (0: no cap), how
    # many more wait for a turn and how long; per caller, `rate_limit` requests a second
    # on average and `rate_burst` at once (0: no limit). Past these: 429 / Retry-After.
    max_concurrent_requests: int = 1024
    max_queued_requests: int = 1024
    queue_timeout: float = 30.0
    rate_limit: float = 0.0
    rate_burst: int = 0
    # A worker stream that sends nothing for this long is given up (a hung worker): before
    # its first chunk the request goes to another worker, after it ends with UNAVAILABLE.
    stream_stall_timeout: float = 30.0
    # On SIGTERM: seconds the requests in flight get to finish (new ones: UNAVAILABLE / 503)
    # before those left end with an error (SSE: an error event, then [DONE]).
    drain_timeout: float = 30.0
    # What one client request may be (checked before tokenizing): its prompt text in
    # UTF-8 bytes, its HTTP body, its choices (prompts x n), its top logprobs per token.
    max_prompt_bytes: int = 4 * 1024 * 1024
    max_body_bytes: int = 16 * 1024 * 1024
    max_choices: int = 256
    max_top_logprobs: int = 20
    # Connections at the HTTP and gRPC ports (radixmesh/listener.py gives the reasons): the
    # seconds a request head / an HTTP body may take to arrive, the seconds a connection
    # may stay open with no request; connections open at once per port (0: from the
    # descriptor limit) and from one address (HTTP; 0: no cap).
    header_timeout: float = ListenerLimits.header_timeout
    body_timeout: float = ListenerLimits.body_timeout
    idle_timeout: float = ListenerLimits.idle_timeout
    max_connections: int = ListenerLimits.max_connections
    max_connections_per_peer: int = ListenerLimits.max_connections_per_peer

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(self.max_prompt_bytes, self.max_choices, self.max_top_logprobs)

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(
            self.header_timeout,
            self.body_timeout,
            self.idle_timeout,
            self.max_connections,
            self.max_connections_per_peer,
        )

    @property
    def caller_keys(self) -> tuple[str, ...]:
        """Every key a client may call with (API and admin keys); empty: anyone may."""
        return (*self.api_keys, *self.admin_keys) if self.api_keys else ()

    def __post_init__(self) -> None:
        self._check_addresses_and_numbers()
        self._check_keys_and_tls()
        self._check_limits()

    def _check_addresses_and_numbers(self) -> None:
        if not self.workers:
            raise InvalidArgument("workers", "give at least one worker address")
        if not 0 <= self.port < 65536:
            raise InvalidArgument("port", f"must be in [0, 65536), got {self.port}")
        for name in (
            "summary_budget_bytes",
            "request_cost_tokens",
            "breaker_failures",
            "program_max_queued",
        ):
            if getattr(self, name) < 0:
                raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("tentative_ttl", "health_interval", "health_timeout", "breaker_cooldown"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(name, f"must be > 0, got {getattr(self, name)}")
        for name in ("http_port", "metrics_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 65536:
                raise InvalidArgument(name, f"must be in [0, 65536), got {value}")
        if not self.pending_prefill_weight >= 0:
            raise InvalidArgument(
                "pending_prefill_weight", f"must be >= 0, got {self.pending_prefill_weight}"
            )
        if self.discovery_interval <= 0:
            raise InvalidArgument(
                "discovery_interval", f"must be > 0, got {self.discovery_interval}"
            )
        for address in self.workers:
            if address.startswith(DNS_PREFIX) and ":" not in address[len(DNS_PREFIX) :]:
                raise InvalidArgument("workers", f"{address!r}: expected dns:name:port")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise InvalidArgument(
                "tool_call_parser",
                f"must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}",
            )

    def _check_keys_and_tls(self) -> None:
        for name in ("api_keys", "admin_keys"):
            for key in getattr(self, name):
                if not key or not key.isascii() or not key.isprintable() or " " in key:
                    raise InvalidArgument(name, "a key must be printable ASCII without spaces")
        if self.worker_api_key == "":
            raise InvalidArgument("worker_api_key", "must not be empty (None: send no key)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("tls_cert", "give both tls_cert and tls_key, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls_client_ca", "client certificates need tls_cert/tls_key")
        if (self.worker_tls_cert is None) != (self.worker_tls_key is None):
            raise InvalidArgument(
                "worker_tls_cert", "give both worker_tls_cert and worker_tls_key, or neither"
            )
        if self.worker_tls_ca is None and (self.worker_tls_cert or self.worker_tls_server_name):
            raise InvalidArgument("worker_tls_ca", "router -> worker TLS needs worker_tls_ca")

    def _check_limits(self) -> None:
        for name in ("max_concurrent_requests", "max_queued_requests", "rate_burst"):
            if getattr(self, name) < 0:
                raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("max_prompt_bytes", "max_body_bytes", "max_choices"):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("queue_timeout", "stream_stall_timeout"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(name, f"must be > 0, got {getattr(self, name)}")
        if not self.rate_limit >= 0 or not self.drain_timeout >= 0 or self.max_top_logprobs < 0:
            name = "rate_limit" if not self.rate_limit >= 0 else "drain_timeout"
            name = name if self.max_top_logprobs >= 0 else "max_top_logprobs"
            raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        self.listener_limits  # noqa: B018 (validates those fields)
        if self.max_attempts < 1:
            raise InvalidArgument("max_attempts", f"must be >= 1, got {self.max_attempts}")
