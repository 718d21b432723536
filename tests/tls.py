"""A self-signed TLS certificate for tests of servers on localhost / 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) in `directory`, made with the `openssl` CLI, valid one day."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "the openssl CLI is needed to make a test certificate"
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
