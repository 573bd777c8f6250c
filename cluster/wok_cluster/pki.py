"""Keys and certificates for one test control plane, made with the openssl CLI.

A private CA signs the apiserver's serving certificate (SANs for 127.0.0.1 and localhost, so
clients verify TLS instead of skipping it), and a separate key pair signs ServiceAccount tokens.
A second CA, the front-proxy CA, signs only the client certificate the aggregation layer presents
to extension apiservers (KEDA's metrics adapter): they trust the identity headers of a request
only when it comes with a certificate from that CA, as on a kubeadm cluster. Other components'
serving certificates (`serving_cert`) come from the main CA.
P-256 keys: generated in milliseconds, accepted by every component.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
# the CN the apiserver's --requestheader-allowed-names accepts
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str, subject: str) -> None:
    _openssl("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "3650", "-subj", f"/CN={subject}", cwd=directory)  # fmt: skip
    (directory / f"{name}.key").chmod(0o600)


def _signed(directory: Path, name: str, *, ca: str, subject: str, extensions: str) -> None:
    """`name`.key and `name`.crt, signed by the CA `ca`.crt/.key in `directory`."""
    d = directory
    _openssl("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={subject}", cwd=d)  # fmt: skip
    (d / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "3650", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=d)  # fmt: skip
    (d / f"{name}.key").chmod(0o600)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    _ca(d, "ca", "wok-test-ca")
    _signed(
        d,
        "apiserver",
        ca="ca",
        subject="kube-apiserver",
        extensions="subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-out", "sa.key", cwd=d)  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    (d / "sa.key").chmod(0o600)
    _ca(d, "front-proxy-ca", "wok-front-proxy-ca")
    _signed(
        d,
        "front-proxy-client",
        ca="front-proxy-ca",
        subject=FRONT_PROXY_CLIENT,
        extensions="extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    return Pki(
        ca_cert=d / "ca.crt",
        ca_key=d / "ca.key",
        serving_cert=d / "apiserver.crt",
        serving_key=d / "apiserver.key",
        sa_key=d / "sa.key",
        sa_pub=d / "sa.pub",
        front_proxy_ca_cert=d / "front-proxy-ca.crt",
        front_proxy_client_cert=d / "front-proxy-client.crt",
        front_proxy_client_key=d / "front-proxy-client.key",
    )


def serving_cert(
    pki: Pki, name: str, *, ips: Sequence[str], dns: Sequence[str]
) -> tuple[Path, Path]:
    """A certificate from the main CA for a component's server that is also a client of another
    (KEDA's adapter and operator speak mutual TLS): (cert, key) in the CA's directory."""
    sans = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{host}" for host in dns)])
    _signed(
        pki.ca_cert.parent,
        name,
        ca=pki.ca_cert.stem,
        subject=name,
        extensions=f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    return pki.ca_cert.parent / f"{name}.crt", pki.ca_cert.parent / f"{name}.key"
