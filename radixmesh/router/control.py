"""The router's control plane: which worker serves a prompt, and what the cluster serves.

It owns the worker pool (health, load, the cache-event summaries: pool.py), the policy,
the program table and the served model (the tokenizer and model info a worker named).
Front ends reach it through one call, `pick(ids, exclude, hint) -> Placement`, plus the
model they tokenize for: the generation path (dispatch.py) never sees a summary or the
policy, so the gRPC and HTTP front ends, and the path between them and the workers, can
change or multiply without touching routing.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

import grpc

from radixmesh.errors import Unavailable
from radixmesh.prefix import block_hashes
from radixmesh.router.config import RouterConfig
from radixmesh.router.hot import place
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.policy import Candidate, Policy, PolicyOptions, make_policy
from radixmesh.router.pool import WorkerHandle, WorkerPool
from radixmesh.router.programs import ProgramHint, ProgramTable
from radixmesh.tokenizer import TokenizerLike, tokenizer_for
from radixmesh.v1 import common_pb2, worker_pb2


class Placement(NamedTuple):
    """Where a prompt goes: the worker, and how many of the prompt's tokens it caches, on its
    device or in host memory: the rest is what it prefills (the pending-prefill estimate;
    a reload from host memory is a copy, not prefill work)."""

    worker: WorkerHandle
    cached: int


class ControlPlane:
    def __init__(self, config: RouterConfig, pool: WorkerPool, metrics: RouterMetrics) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        options = PolicyOptions(
            request_cost_tokens=config.request_cost_tokens,
            pending_prefill_weight=config.pending_prefill_weight,
            host_hit_cost=config.host_hit_cost,
            cold_partition=(config.replica_index, config.replicas),
            grammar_affinity_tokens=config.grammar_affinity_tokens,
        )
        self.policy: Policy = make_policy(config.policy, config.seed, options)
        self.programs = ProgramTable(config.program_max_queued)
        # Set once a worker has answered (load_model_info); None while starting.
        self.tokenizer: TokenizerLike | None = None
        self.model_info: common_pb2.ModelInfo | None = None

    async def load_model_info(self) -> None:
        """Ask a healthy worker what it serves and load the same tokenizer."""
        for w in self.pool.workers.values():
            if not w.healthy:
                continue
            resp = await w.stub.GetModelInfo(
                worker_pb2.GetModelInfoRequest(), timeout=30, metadata=w.metadata
            )
            # The router only tokenizes: the shared loader, fed the worker's vocabulary.
            info = resp.info
            self.tokenizer = await asyncio.to_thread(
                tokenizer_for,
                info.tokenizer,
                vocab_size=info.vocab_size,
                eos_token_ids=info.eos_token_ids,
                bos_token_id=info.bos_token_id if info.HasField("bos_token_id") else None,
                download_dir=self.config.download_dir,
                chat_template=info.chat_template or None,
            )
            self.model_info = resp.info
            return
        raise Unavailable("no healthy worker to ask for the model")

    def pick(
        self,
        ids: list[int],
        exclude: set[str],
        hint: ProgramHint | None = None,
        grammar: int | None = None,
    ) -> Placement:
        """The worker for a prompt (never one in `exclude`) and how many of its tokens that
        worker caches; a program's request stays with its program while that worker's load
        allows. `grammar`: the key of the request's constraint (wire.grammar_key_of), for
        the policy's grammar affinity. Raises Unavailable when no worker can take it.

        The chosen worker's summary counts the prompt's blocks as tentatively cached (its
        own announcement of them follows as a pending cache event), so the next prompt
        sharing the prefix follows this one before the worker has prefilled it."""
        started = time.perf_counter()
        hashes: dict[int, list[int]] = {}
        cached: dict[str, int] = {}
        host_cached: dict[str, int] = {}  # only workers with host-memory hits
        candidates = []
        if not self.config.grammar_affinity_tokens:
            grammar = None  # (off: no worker holds it, as far as routing is concerned)
        for wid, w in self.pool.workers.items():
            bs = w.block_size
            device = host = 0
            if bs:
                if bs not in hashes:
                    hashes[bs] = block_hashes(ids, bs)
                summary = w.summary
                if summary.num_host:  # a host tier: its hits too (else as cheap as before)
                    device, host = summary.match_tiers(hashes[bs])
                else:
                    device = summary.match(hashes[bs])
            cached[wid] = (device + host) * bs
            if host:
                host_cached[wid] = host * bs
            c = w.candidate(device * bs, host * bs, grammar is not None and grammar in w.grammars)
            if wid in exclude:
                c = c._replace(healthy=False)
            candidates.append(c)
        chosen_id = self.programs.home(hint, candidates)
        if chosen_id is None:
            try:
                chosen_id = self.policy.choose(len(ids), candidates)
            except Unavailable:
                # Workers that said they are full are left out while others can serve;
                # when none can, one of them gets the request (it may have room now).
                candidates = self._with_full(candidates, exclude)
                chosen_id = self.policy.choose(len(ids), candidates)
            if self.pool.hot is not None:
                chosen_id = self._hot(len(ids), hashes, candidates, chosen_id)
            self.programs.placed(hint, chosen_id)
        chosen = self.pool.workers[chosen_id]
        if chosen.block_size:
            chosen.summary.add_tentative(hashes[chosen.block_size], self.config.tentative_ttl)
            self.pool.index.enforce_budget()
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        self.metrics.decisions.labels(self.policy.name, chosen.worker_id).inc()
        if host_cached:
            self.metrics.host_cached_tokens.inc(host_cached.get(chosen.worker_id, 0))
        return Placement(chosen, cached[chosen.worker_id])

    def _hot(
        self,
        prompt_tokens: int,
        hashes: dict[int, list[int]],
        candidates: list[Candidate],
        chosen_id: str,
    ) -> str:
        """Hot-prefix replication (`--hot-prefix-replication`, router/hot.py) on top of the
        policy's choice: the simulator's rule and step (`hot.place`), on the prompt's block
        hashes at the chosen worker's block size and the pool's clock."""
        hot = self.pool.hot
        assert hot is not None
        bs = self.pool.workers[chosen_id].block_size
        key = hot.key(hashes[bs]) if bs else None
        if key is None:
            return chosen_id  # (the worker's block size is not known yet, or a short prompt)
        now = self.pool.clock()
        return place(hot, self.policy, key, now, prompt_tokens, candidates, chosen_id)

    def _with_full(self, candidates: list[Candidate], exclude: set[str]) -> list[Candidate]:
        """`candidates` with the workers that are only full (up, breaker closed) healthy."""
        workers = self.pool.workers
        return [
            c._replace(healthy=True)
            if not c.healthy
            and c.worker_id not in exclude
            and workers[c.worker_id].full
            and workers[c.worker_id].reachable
            and workers[c.worker_id].breaker.allows()
            else c
            for c in candidates
        ]

    def healthy_workers(self) -> int:
        return sum(w.healthy for w in self.pool.workers.values())

    async def flush_all(self) -> tuple[int, int]:
        """Flush every worker's cache: (how many flushed, how many workers)."""

        async def flush(w: WorkerHandle) -> bool:
            try:
                resp = await w.stub.FlushCache(
                    worker_pb2.FlushCacheRequest(), timeout=30, metadata=w.metadata
                )
            except grpc.aio.AioRpcError:
                return False
            return bool(resp.flushed)

        results = await asyncio.gather(*(flush(w) for w in self.pool.workers.values()))
        return sum(results), len(results)
