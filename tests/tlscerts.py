"""Certificates for the TLS tests, made on the spot with `cryptography` (no files checked in,
nothing downloaded): a CA, and certificates it signs for the broker and for clients, valid now,
expired, or signed by another CA; a CA's revocation list."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that signs certificates into `directory`."""

    name: str
    directory: Path
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    cert: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        cert = directory / f"{name}.pem"
        cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return cls(name, directory, key, certificate, cert)

    def issue(
        self,
        common_name: str,
        *,
        server: bool = False,
        expired: bool = False,
        file_name: str | None = None,
    ) -> Issued:
        """A certificate for `common_name`: a server's (for localhost and 127.0.0.1) or a
        client's; `expired` ended yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = (now - 10 * _DAY, now - _DAY) if expired else (now - _DAY, now + 10 * _DAY)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        certificate = builder.sign(self.key, hashes.SHA256())
        stem = file_name or f"{self.name}-{common_name}" + ("-expired" if expired else "")
        cert = self.directory / f"{stem}.pem"
        key_path = self.directory / f"{stem}.key"
        cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)
        return Issued(cert, key_path)

    def revocation_list(self, revoked: list[Issued], file_name: str | None = None) -> Path:
        """A CRL (PEM) of this CA that revokes the `revoked` certificates (and no other)."""
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.certificate.subject)
            .last_update(now - _DAY)
            .next_update(now + 10 * _DAY)
        )
        for issued in revoked:
            serial = x509.load_pem_x509_certificate(issued.cert.read_bytes()).serial_number
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(serial)
                .revocation_date(now - _DAY)
                .build()
            )
        crl = builder.sign(self.key, hashes.SHA256())
        path = self.directory / (file_name or f"{self.name}-crl.pem")
        path.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
        return path
