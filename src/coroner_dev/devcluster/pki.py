"""Throwaway certificates for the local control plane.

One CA signs the API server's serving certificate and every client certificate (admin is
O=system:masters); a separate RSA key signs ServiceAccount tokens. Everything lives under the
cluster directory and dies with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Pki:
    """Paths of the files a cluster directory's `pki/` holds."""

    directory: pathlib.Path

    @property
    def ca_cert(self) -> pathlib.Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> pathlib.Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> pathlib.Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> pathlib.Path:
        return self.directory / "apiserver.key"

    @property
    def sa_key(self) -> pathlib.Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> pathlib.Path:
        return self.directory / "sa.pub"

    def client_cert(self, user: str) -> pathlib.Path:
        return self.directory / f"user-{user}.crt"

    def client_key(self, user: str) -> pathlib.Path:
        return self.directory / f"user-{user}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: pathlib.Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def ensure_pki(directory: pathlib.Path) -> Pki:
    """Creates the CA, serving cert, admin cert and SA signing key once; reuses them afterwards."""
    pki = Pki(directory=directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    if not pki.ca_cert.exists():
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coroner-dev-cluster-ca")])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        _write_key(pki.ca_key, key)
        pki.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if not pki.serving_cert.exists():
        _issue(
            pki,
            common_name="kube-apiserver",
            organizations=(),
            cert_path=pki.serving_cert,
            key_path=pki.serving_key,
            server=True,
        )
    if not pki.sa_key.exists():
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pki.sa_key, sa_key)
        pki.sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    ensure_client_cert(pki, user="admin", groups=("system:masters",))
    return pki


def ensure_client_cert(pki: Pki, *, user: str, groups: tuple[str, ...]) -> tuple[pathlib.Path, pathlib.Path]:
    """A client certificate for `user` in `groups` (CN and O, as kube-apiserver reads them)."""
    cert_path, key_path = pki.client_cert(user), pki.client_key(user)
    if not cert_path.exists():
        _issue(pki, common_name=user, organizations=groups, cert_path=cert_path, key_path=key_path, server=False)
    return cert_path, key_path


def _issue(
    pki: Pki,
    *,
    common_name: str,
    organizations: tuple[str, ...],
    cert_path: pathlib.Path,
    key_path: pathlib.Path,
    server: bool,
) -> None:
    ca_cert, ca_key = _load_ca(pki)
    key = _new_key()
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes"),
                    x509.DNSName("kubernetes.default"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
