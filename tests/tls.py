"""Throwaway certificates for TLS tests, made with openssl."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> None:
    """ca.pem; server.pem/key for 127.0.0.1; client.pem/key; all signed by the CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=messaging test CA", "-keyout", "ca-key.pem", "-out", "ca.pem", cwd=directory)
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage="
                                       "serverAuth,clientAuth"),
                            ("client", "extendedKeyUsage=clientAuth")):
        (directory / f"{name}.ext").write_text(extension + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
                f"{name}-key.pem", "-out", f"{name}.csr", cwd=directory)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", "-extfile",
                f"{name}.ext", cwd=directory)
