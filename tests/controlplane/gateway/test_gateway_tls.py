"""The gateway's certificate files: created once, reused, renewed by the same CA."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from controlplane.gateway.tls import GATEWAY_NAME, ensure_server_tls


def test_created_once_then_reused(tmp_path: Path) -> None:
    first = ensure_server_tls(tmp_path, ["gw.example.com"])
    again = ensure_server_tls(tmp_path, ["gw.example.com"])
    assert first == again
    for name in ("ca.key", "server.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    leaf = x509.load_pem_x509_certificate(first.cert_pem)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert GATEWAY_NAME in names.get_values_for_type(x509.DNSName)
    assert "gw.example.com" in names.get_values_for_type(x509.DNSName)
    assert first.fingerprint.startswith("sha256:")


def test_expiring_leaf_is_renewed_by_the_same_ca(tmp_path: Path) -> None:
    first = ensure_server_tls(tmp_path)
    # Replace the leaf with one that expires in a week.
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate(first.ca_pem)
    leaf = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    soon = (
        x509.CertificateBuilder()
        .subject_name(leaf.subject)
        .issuer_name(ca.subject)
        .public_key(leaf.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
        .not_valid_after(dt.datetime.now(dt.UTC) + dt.timedelta(days=7))
        .sign(ca_key, leaf.signature_hash_algorithm)  # type: ignore[arg-type]
    )
    (tmp_path / "server.pem").write_bytes(soon.public_bytes(serialization.Encoding.PEM))
    renewed = ensure_server_tls(tmp_path)
    assert renewed.ca_pem == first.ca_pem
    assert renewed.leaf_sha256 != first.leaf_sha256
    new_leaf = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    assert new_leaf.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=300)
