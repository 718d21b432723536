"""The router: one front door over many workers, placing each request where its prefix lives.

Modules: `config` (RouterConfig), `summary` (per-worker prefix summaries under a global
byte budget), `policy` (routing policies behind a registry), `breaker` (per-worker circuit
breaker), `pool` (workers: health checks, load, cache-event subscriptions), `service`
(the `radixmesh.v1.Router` servicer), `server` (the process), `http` (the HTTP server,
`api_error` its error replies), `openai/` (the OpenAI-compatible API).
"""
