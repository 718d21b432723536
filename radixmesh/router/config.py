"""RouterConfig: every knob of the router, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.auth import Roles
from radixmesh.errors import InvalidArgument
from radixmesh.listener import ListenerLimits
from radixmesh.router.hot import HotPrefixConfig
from radixmesh.router.http.openai.tool_parsers import PARSERS
from radixmesh.router.limits import RequestLimits

TOOL_CALL_PARSERS = ("auto", *PARSERS)

DNS_PREFIX = "dns:"


@dataclass(frozen=True)
class RouterConfig:
    """Every field but `workers` and the keys is a `radixmesh router` flag named after it,
    with the field's docstring as its help (cluster/router_flags.py): say each one here."""

    workers: tuple[str, ...]
    """Worker addresses, host:port; `dns:name:port` stands for every address the name
    resolves to, re-resolved every `discovery_interval` (a headless Service's pods)."""
    host: str = "0.0.0.0"
    """The address the gRPC and HTTP ports listen on."""
    port: int = 50050
    """The router's gRPC port."""
    policy: str = "cache_aware"
    """How a worker is chosen (router/policy.py)."""
    seed: int | None = None
    """The policy's random tie-breaks (None: unseeded)."""
    replicas: int = 1
    """Router replicas in front of the same workers (the launcher sets it): cache_aware
    places a prompt no worker caches on this replica's share of the workers, unless one
    outside it is cheaper by more than a prefill of the prompt (policy.py)."""
    replica_index: int = 0
    """This replica's index among `replicas` (0-based; the launcher sets it)."""
    summary_budget_bytes: int = 256 * 1024 * 1024
    """Bytes every worker's prefix summary together may hold (accounted per block)."""
    tentative_ttl: float = 5.0
    """Seconds a routed prompt counts as cached on its worker before its cache events."""
    request_cost_tokens: int = 64
    """cache_aware: the prefill tokens a queued or running request costs (policy.py)."""
    pending_prefill_weight: float = 0.5
    """cache_aware: the cost of a prompt token routed to a worker and not prefilled yet."""
    host_hit_cost: float = 0.2
    """cache_aware: the cost of a prompt token a worker holds in host memory (reloaded over
    PCIe instead of prefilled), relative to prefilling it; 1.0 counts it as a miss (policy.py)."""
    grammar_affinity_tokens: int = 32
    """cache_aware: what a worker that has the request's grammar compiled is worth, in prefill
    tokens: among workers costing within this much of each other, one holding the grammar
    wins (policy.py); 0 turns grammar affinity off."""
    hot_prefix_replication: bool = False
    """cache_aware: give a prefix whose requests outrun one worker home workers
    (router/hot.py), added where a copy is cheaper. Off by default: in the router simulator
    it gains 1.15-1.45x goodput where a long (8k-token) prompt carries most of the traffic
    and nothing on average with 2k-token ones, and it is not measured on real workers
    (docs/router-sim.md, "Hot prefixes")."""
    hot_prefix_window: float = 1.0
    """Hot prefixes: seconds over which a prefix's requests and a worker's finished
    requests are counted (its load, the workers' measured capacity)."""
    hot_prefix_utilization: float = 0.8
    """Hot prefixes: a prefix gains a home while its load exceeds this share of the measured
    capacity per home."""
    hot_prefix_shrink_utilization: float = 0.5
    """Hot prefixes: its last-added home is dropped once its load fits one home fewer at this
    share (below `hot_prefix_utilization`, so a prefix at the boundary does not flap)."""
    hot_prefix_max_homes: int = 8
    """Hot prefixes: the most homes one prefix gets."""
    hot_prefix_key_blocks: int = 4
    """Hot prefixes: prompts sharing their first this many blocks are one prefix."""
    hot_prefix_new_home_prefill: float = 0.5
    """Hot prefixes: a worker that is not one of a hot prefix's homes counts as prefilling
    this share of the prompt it lacks (a copy's prefill serves the requests after it too;
    1.0: as cache_aware counts it)."""
    health_interval: float = 1.0
    """Seconds between GetLoad polls of each worker."""
    health_timeout: float = 2.0
    """Seconds a worker's health poll may take."""
    liveness_window: float = 10.0
    """A worker whose health poll times out is down only once it has also said nothing on
    any channel (output batches, chunks, cache events, its engine's load reports) for this
    many seconds; until then it is busy (router/liveness.py says why)."""
    breaker_failures: int = 3
    """Consecutive failures that stop routing to a worker for a while (its breaker opens)."""
    breaker_cooldown: float = 5.0
    """Seconds an open breaker stays open before a trial request."""
    max_attempts: int = 3
    """Workers a request may try when they fail before its first token."""
    require_deterministic: bool = False
    """Admit only workers that run in deterministic mode (`--deterministic`, reported in
    their health polls): any other is logged as refused and never routed to."""
    program_max_queued: int = 32
    """A tagged program's requests stay on the worker holding its prefix while that worker
    runs or queues fewer requests than this (programs.py; 0: off)."""
    http_port: int | None = None
    """The HTTP API's port, OpenAI's and SGLang's (None: off)."""
    strict_openai: bool = True
    """Refuse unknown fields in OpenAI and Anthropic requests with a 400 naming them, as
    those APIs do; `--no-strict-openai` ignores them instead (each name logged once), for
    clients that send other servers' extensions."""
    tool_call_parser: str = "auto"
    """The model's tool-call syntax (openai/tool_parsers.py); auto: from its chat template."""
    separate_reasoning: bool = False
    """Return `<think>...</think>` as reasoning_content unless a request says otherwise."""
    response_store_bytes: int = 64 * 1024 * 1024
    """The largest stored Response (`previous_response_id`, retrieve, input items) in
    bytes; 0: none stored. Entries live on the workers, each bounding its own total
    (openai/responses_api/worker_store.py)."""
    response_store_entries: int = 65536
    """0: no Response is stored (else the workers' own bounds hold: 65,536 each)."""
    response_store_ttl: float = 3600.0
    """Seconds a stored response can be retrieved or continued with `previous_response_id`."""
    metrics_port: int | None = None
    """Prometheus /metrics on a port of its own (None: only on the HTTP port)."""
    listen_when_serving: bool = False
    """Open the gRPC and HTTP ports only once serving (a worker answered, the tokenizer is
    loaded), instead of at once with health NOT_SERVING: for replicas sharing ports on one
    host (SO_REUSEPORT), where a starting replica must not take connections it cannot serve."""
    per_request_streams: bool = False
    """Read each request's chunks on its own worker call instead of the worker's output
    stream (router/outputs.py), which carries every request's chunks per step."""
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    """Clients must send `authorization: Bearer <one of these>` (empty: no authentication)."""
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    """FlushCache, ClusterStatus, the workers in /get_server_info and aborting another
    caller's request need one of these (they are API keys too). Empty: any API key may see
    and flush the cluster, and nobody reaches another caller's requests (everybody,
    without API keys); see auth.Roles."""
    tls_cert: str | None = None
    """PEM certificate chain; with `tls_key`, the gRPC and HTTP ports serve TLS."""
    tls_key: str | None = None
    """PEM private key of `tls_cert`."""
    worker_api_key: str | None = field(default=None, repr=False)
    """The key the router sends to workers started with `--api-key` (None: none sent)."""
    download_dir: str | None = None
    """The Hugging Face hub cache for a hub model's tokenizer (None: huggingface_hub's)."""
    tls_client_ca: str | None = None
    """With TLS: clients must present a certificate this CA signed (mutual TLS)."""
    worker_tls_ca: str | None = None
    """Router -> worker TLS: the CA that signed the workers' certificates (set: TLS)."""
    worker_tls_cert: str | None = None
    """The router's certificate, for workers that require one (mutual TLS)."""
    worker_tls_key: str | None = None
    """Its private key."""
    worker_tls_server_name: str | None = None
    """The name the workers' certificates carry, when they are reached by IP (DNS discovery)."""
    discovery_interval: float = 5.0
    """Seconds between look-ups of `dns:` worker names."""
    max_concurrent_requests: int = 1024
    """Requests on the workers at once (admission.py; 0: no cap); past it and the queue: 429."""
    max_queued_requests: int = 1024
    """Requests waiting for a turn beyond `max_concurrent_requests`."""
    queue_timeout: float = 30.0
    """Seconds a request may wait for a turn."""
    rate_limit: float = 0.0
    """Requests a second per caller, on average (0: no limit); past it: 429 / Retry-After."""
    rate_burst: int = 0
    """Requests at once per caller (0: the rate, rounded up)."""
    stream_stall_timeout: float = 30.0
    """Seconds a worker may send nothing at all before its request is given up (a hung
    worker): before its first chunk the request goes to another worker, after it ends
    with UNAVAILABLE."""
    drain_timeout: float = 30.0
    """On SIGTERM: seconds the requests in flight get to finish (new ones: UNAVAILABLE / 503)
    before those left end with an error (SSE: an error event, then [DONE])."""
    max_prompt_bytes: int = 4 * 1024 * 1024
    """UTF-8 bytes of prompt text per request (checked before tokenizing)."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Bytes of an HTTP request body."""
    max_choices: int = 256
    """Prompts x n per request (and choices of a select)."""
    max_top_logprobs: int = 20
    """Top logprobs per token."""
    max_messages: int = 4096
    """Chat messages per request, counted on the raw JSON before anything parses or renders
    it (limits.py). Far above real use (OpenAI's API takes at most 2048); what it bounds:
    ~10 s of router work for 100k messages."""
    max_tools: int = 512
    """Tool definitions per request, counted on the raw JSON (OpenAI's API takes 128)."""
    max_prompt_tokens: int = 1 << 20
    """Token ids per request, all its prompts together (each is also held to the model's
    context): 1M ids is 8 prompts of a 128k context."""
    header_timeout: float = ListenerLimits.header_timeout
    """Seconds a request head (and the TLS handshake) may take to arrive, at the HTTP and
    gRPC ports (radixmesh/listener.py gives the reasons for each default)."""
    body_timeout: float = ListenerLimits.body_timeout
    """Seconds an HTTP body may take to arrive after its head (then: 408, closed)."""
    idle_timeout: float = ListenerLimits.idle_timeout
    """Seconds a connection may stay open with no request in flight."""
    max_connections: int = ListenerLimits.max_connections
    """Connections open at once per port (0: the port's share of the descriptor limit);
    past it a new HTTP connection gets 503 + Retry-After, a gRPC one is refused."""
    max_connections_per_peer: int = ListenerLimits.max_connections_per_peer
    """HTTP connections open at once from one address (0: no cap; behind a proxy that sends
    every client from one address, set 0)."""
    keyless_connections: int = ListenerLimits.keyless_connections
    """With API keys: connections per port that have not authenticated yet; one more evicts
    the oldest of them (never one that authenticated)."""
    keyless_per_peer: int = ListenerLimits.keyless_per_peer
    """With API keys: connections from one address that have not authenticated yet."""
    auth_failures: int = ListenerLimits.auth_failures
    """With API keys: calls without a valid key after which a connection that never sent
    one is closed (gRPC GOAWAY, HTTP `Connection: close`)."""
    auth_window: float = ListenerLimits.auth_window
    """With API keys: seconds from its accept a connection gets to authenticate."""

    @property
    def hot_prefixes(self) -> HotPrefixConfig | None:
        """The hot-prefix rule's settings (None: replication off)."""
        if not self.hot_prefix_replication:
            return None
        return self._hot_prefix_config()

    def _hot_prefix_config(self) -> HotPrefixConfig:
        return HotPrefixConfig(
            window_s=self.hot_prefix_window,
            utilization=self.hot_prefix_utilization,
            shrink_utilization=self.hot_prefix_shrink_utilization,
            max_homes=self.hot_prefix_max_homes,
            key_blocks=self.hot_prefix_key_blocks,
            new_home_prefill=self.hot_prefix_new_home_prefill,
        )

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(
            max_prompt_bytes=self.max_prompt_bytes,
            max_choices=self.max_choices,
            max_top_logprobs=self.max_top_logprobs,
            max_messages=self.max_messages,
            max_tools=self.max_tools,
            max_prompt_tokens=self.max_prompt_tokens,
        )

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(
            self.header_timeout,
            self.body_timeout,
            self.idle_timeout,
            self.max_connections,
            self.max_connections_per_peer,
            self.keyless_connections,
            self.keyless_per_peer,
            self.auth_failures,
            self.auth_window,
        )

    @property
    def caller_keys(self) -> tuple[str, ...]:
        """Every key a client may call with (API and admin keys); empty: anyone may."""
        return (*self.api_keys, *self.admin_keys) if self.api_keys else ()

    @property
    def roles(self) -> Roles:
        """Who may see and operate the cluster, and reach others' requests."""
        return Roles(self.api_keys, self.admin_keys)

    def __post_init__(self) -> None:
        self._check_addresses_and_numbers()
        self._check_keys_and_tls()
        self._check_limits()

    def _check_addresses_and_numbers(self) -> None:
        if not self.workers:
            raise InvalidArgument("workers", "give at least one worker address")
        if not 0 <= self.port < 65536:
            raise InvalidArgument("port", f"must be in [0, 65536), got {self.port}")
        if self.replicas < 1:
            raise InvalidArgument("replicas", f"must be >= 1, got {self.replicas}")
        if not 0 <= self.replica_index < self.replicas:
            raise InvalidArgument(
                "replica_index", f"must be in [0, {self.replicas}), got {self.replica_index}"
            )
        for name in (
            "summary_budget_bytes",
            "request_cost_tokens",
            "breaker_failures",
            "program_max_queued",
            "response_store_bytes",
            "response_store_entries",
        ):
            if getattr(self, name) < 0:
                raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        for name in (
            "tentative_ttl",
            "health_interval",
            "health_timeout",
            "liveness_window",
            "breaker_cooldown",
            "response_store_ttl",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(name, f"must be > 0, got {getattr(self, name)}")
        for name in ("http_port", "metrics_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 65536:
                raise InvalidArgument(name, f"must be in [0, 65536), got {value}")
        # One port for two protocols would not fail to bind: gRPC and the HTTP listener both
        # set SO_REUSEPORT (replicas share ports), so the kernel would split connections
        # between them and each would see the other's clients as malformed.
        taken = {"port": self.port}
        for name in ("http_port", "metrics_port"):
            value = getattr(self, name)
            if not value:  # None: off; 0: the kernel picks
                continue
            for other, port in taken.items():
                if value == port:
                    raise InvalidArgument(name, f"{value} is also the {other}; give another")
            taken[name] = value
        if not self.pending_prefill_weight >= 0:
            raise InvalidArgument(
                "pending_prefill_weight", f"must be >= 0, got {self.pending_prefill_weight}"
            )
        if self.grammar_affinity_tokens < 0:
            raise InvalidArgument(
                "grammar_affinity_tokens", f"must be >= 0, got {self.grammar_affinity_tokens}"
            )
        if not 0 <= self.host_hit_cost <= 1:
            raise InvalidArgument("host_hit_cost", f"must be in [0, 1], got {self.host_hit_cost}")
        try:  # the thresholds are checked on or off, under their flags' names
            self._hot_prefix_config()
        except InvalidArgument as e:
            name = "hot_prefix_window" if e.field == "window_s" else f"hot_prefix_{e.field}"
            raise InvalidArgument(name, e.message) from None
        if self.hot_prefix_replication and self.policy != "cache_aware":
            raise InvalidArgument(
                "hot_prefix_replication", f"needs policy cache_aware, got {self.policy!r}"
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
        for name in (
            "max_prompt_bytes",
            "max_body_bytes",
            "max_choices",
            "max_messages",
            "max_tools",
            "max_prompt_tokens",
        ):
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
