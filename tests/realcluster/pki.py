"""Certificates and keys for a loopback control plane, made with the `openssl` command.

One CA signs everything: the API server's serving certificate, the admin's client
certificate (group system:masters), and the serving certificate of the webhooks that
run on 127.0.0.1 (Kueue's). The service-account signing key pair is separate.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

_DAYS = "3650"


class PkiError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {done.stderr.strip()[-1000:]}")


def _signed(folder: Path, name: str, subject: str, *, sans: list[str] | None = None,
            client: bool = False) -> None:
    """`name.crt`/`name.key` in `folder`, signed by the CA there."""
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=folder)
    usage = "clientAuth" if client else "serverAuth"
    extensions = [f"extendedKeyUsage={usage}", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if sans:
        extensions.append("subjectAltName=" + ",".join(sans))
    (folder / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", _DAYS, "-sha256",
             "-extfile", f"{name}.ext", cwd=folder)


def make(folder: Path) -> Path:
    """Everything the control plane needs, in `folder` (made once; reused after)."""
    if shutil.which("openssl") is None:
        raise PkiError("needs `openssl` on PATH (Debian package openssl)")
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return folder
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", _DAYS, "-subj", "/CN=healthd-test-ca", cwd=folder)
    loopback = ["IP:127.0.0.1", "DNS:localhost"]
    _signed(folder, "apiserver", "/CN=kube-apiserver", sans=[
        *loopback, "IP:10.96.0.1", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"])
    _signed(folder, "admin", "/O=system:masters/CN=admin", client=True)
    _signed(folder, "webhook", "/CN=webhooks", sans=loopback)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=folder)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)
    (folder / "done").write_text("")
    return folder
