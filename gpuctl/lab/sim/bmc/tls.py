"""SIMULATION: the lab BMCs' CA and their server certificate (one IP SAN per BMC address)."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuctl.fileio import write_atomic
from gpuctl.lab.sim.bmc.credentials import bmc_dir
from gpuctl.lab.system import LabError

# ------------------------------------------------------------------------------------------
# TLS: the lab's CA and the BMCs' certificate


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_pair(key_path: Path, key: Any, cert_path: Path, cert: Any) -> None:
    """The key (PEM, PKCS#8, 0600: never readable by others, not even for a moment), then its
    certificate (PEM, 0644)."""
    from cryptography.hazmat.primitives import serialization

    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_atomic(key_path, key_pem, mode=0o600, durable=True)
    write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644, durable=True)


def _ensure_ca(d: Path) -> tuple[Any, Any]:
    """(CA certificate, CA key), loaded or made."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = d / "ca.pem", d / "ca.key"
    with contextlib.suppress(OSError, ValueError, TypeError):
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if (
            isinstance(key, ec.EllipticCurvePrivateKey)
            and cert.public_key() == key.public_key()
            and cert.not_valid_after_utc > _now() + dt.timedelta(days=30)
        ):
            os.chmod(key_path, 0o600)
            os.chmod(cert_path, 0o644)
            return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpuctl lab (SIMULATION)"),
            x509.NameAttribute(NameOID.COMMON_NAME, "gpuctl lab BMC CA"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(key_path, key, cert_path, cert)
    (d / "server.pem").unlink(missing_ok=True)  # signed by the old CA: made again
    return cert, key


def _server_ok(d: Path, ca: Any, addresses: set[str]) -> bool:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate((d / "server.pem").read_bytes())
        key = serialization.load_pem_private_key((d / "server.key").read_bytes(), password=None)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        cert.verify_directly_issued_by(ca)
    except Exception:  # unreadable, another CA's, damaged: made again
        return False
    have = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return (
        have == addresses
        and cert.public_key() == key.public_key()
        and cert.not_valid_after_utc > _now() + dt.timedelta(days=30)
    )


def ensure_tls(addresses: Sequence[str], directory: Path | None = None) -> bool:
    """The CA (``ca.pem`` 0644, ``ca.key`` 0600) and a server certificate for ``addresses``
    (one IP SAN each; ``server.pem``, ``server.key`` 0600), made when missing, expiring, or
    for other addresses. True when the server certificate was made now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not addresses:
        raise LabError("lab BMCs: no BMC address")
    ips = [ipaddress.ip_address(a) for a in addresses]
    d = directory or bmc_dir()
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ensure_ca(d)
    if _server_ok(d, ca, {str(ip) for ip in ips}):
        return False
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpuctl lab (SIMULATION)"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "gpuctl lab BMC"),
                ]
            )
        )
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ip) for ip in ips]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_pair(d / "server.key", key, d / "server.pem", cert)
    return True


def server_context(directory: Path | None = None) -> ssl.SSLContext:
    d = directory or bmc_dir()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(d / "server.pem"), str(d / "server.key"))
    return context
