"""A small stdlib HTTP client for the router's HTTP tests (plain requests, open streams)."""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from typing import Any


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Http:
    """A small stdlib HTTP client (http.client): plain requests and open streams."""

    def __init__(
        self, port: int, *, context: ssl.SSLContext | None = None, api_key: str | None = None
    ) -> None:
        self.port = port
        self.context = context
        self.headers = {"Content-Type": "application/json"}
        if api_key is not None:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self) -> http.client.HTTPConnection:
        if self.context is not None:
            return http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=60, context=self.context
            )
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        conn = self.connect()
        try:
            conn.request(method, path, body=body, headers=self.headers)
            resp = conn.getresponse()
            text = resp.read().decode()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, text)
        finally:
            conn.close()

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any] | bytes) -> Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request("POST", path, data)

    def open_stream(
        self, path: str, body: dict[str, Any]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """POST and return the open response; read it with readline(), close the conn."""
        conn = self.connect()
        conn.request("POST", path, body=json.dumps(body).encode(), headers=self.headers)
        return conn, conn.getresponse()
