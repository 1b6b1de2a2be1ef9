"""Mutual TLS for the agent stream: the control plane's certificate authority, node certificates and join tokens.

The control plane keeps a CA in a directory of its own (`ca.key`, mode 0600, and `ca.crt`). It issues its own
server certificate for the names and addresses agents dial, and signs each node's certificate when the node joins
with a one-time join token (`llmgw node join`): the node makes its key locally and sends only a CSR, so its private
key never leaves it. Keys are ECDSA P-256; certificates are X.509 v3 made with the `cryptography` package.
A node certificate's subject common name is the node id; the control plane can compare it with the Register message
(`Link.peer_certificate_name`).

Join tokens are stored as SHA-256 hashes with their expiry in `join-tokens.json` in the CA directory, so reading
that file does not reveal a usable token. A token works once and until it expires.

`nodes.json` in the CA directory records, per node id, the node certificates issued and revoked (serial,
validity) and when it was last revoked (`llmgw node revoke ID`). A Join for a node id that still holds a live
certificate is refused (`CertificateExists`) until that certificate is revoked or expires; a revoked certificate
is refused at once (`is_certificate_revoked`, checked by the agents' server when a stream opens and every
`REVOCATION_CHECK_SECONDS` while it lasts). A certificate issued before this record existed is revoked when it
started before the node's last revocation.

`llmgw ca rotate` puts a new CA beside the old one (`ca.next.key`, `ca.next.crt`): from then on the new one signs
node certificates (joins and renewals), both are trusted for agents' certificates and handed to agents as their
trust bundle (`certificate_pem`), and the server certificate stays the old CA's, which every agent trusts. `retire`
renames the new CA over the old one (key first, then certificate: `load_or_create` completes a retirement a crash
interrupted), so the old CA is trusted no more: a certificate it signed is refused (`certificate_refusal`).

A control plane that serves agents in plain text does so only on a loopback address, unless told `--insecure`
(`check_agents_listener`): otherwise any machine that reaches the port could register as a node.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import ipaddress
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.errors import UsageError, WireError

CA_KEY_FILE = "ca.key"
CA_CERT_FILE = "ca.crt"
TOKENS_FILE = "join-tokens.json"
MAX_JOIN_TOKEN_TTL = 7 * 24 * 3600.0  # seconds
NODES_FILE = "nodes.json"
REVOCATION_CHECK_SECONDS = 1.0
"""How often the agents' server re-checks the certificate of an open stream against `nodes.json`."""
NEXT_CA_KEY_FILE = "ca.next.key"
NEXT_CA_CERT_FILE = "ca.next.crt"
CA_DAYS = 3650
SERVER_DAYS = 825
NODE_DAYS = 825
_TOKEN_PREFIX = "llmgw-join-"
_BACKDATE = datetime.timedelta(minutes=5)  # certificates start 5 minutes early, for clocks a little behind


class CertificateExists(WireError):
    """A Join for a node id that already holds a live certificate: revoke that one first (`llmgw node revoke`)."""


def is_loopback(host: str) -> bool:
    """True when `host` ("127.0.0.1", "::1", "[::1]", "localhost") only accepts connections from this machine.

    "" and "0.0.0.0" (every interface) and any other name are not loopback. Pure.
    """
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_agents_listener(host: str, port: int, *, tls: bool, insecure: bool) -> None:
    """Refuse a plain-text agents listener that other machines can reach.

    `tls`: agents connect with mutual TLS. `insecure`: the operator accepts plain text on a network they trust
    (`llmgw server --insecure`). Pure. Raises WireError naming the address and the ways out.
    """
    if tls or insecure or is_loopback(host):
        return
    raise WireError(
        f"refusing to serve agents in plain text on {host or '*'}:{port}: any machine that reaches it could register "
        "as a node, receive engine keys and be sent prompts. Run `llmgw server --tls` (mutual TLS; nodes join with "
        "`llmgw join-token`), listen on 127.0.0.1, or pass --insecure if every machine on that network is trusted."
    )


def _timestamp(moment: datetime.datetime) -> float:
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp() if moment.tzinfo is None else moment.timestamp()


def _not_before(cert: x509.Certificate) -> float:
    return _timestamp(getattr(cert, "not_valid_before_utc", None) or cert.not_valid_before)


def _not_after(cert: x509.Certificate) -> float:
    return _timestamp(getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` with mode 0600 from the start (never readable by others, even briefly)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` by `data` whole (a reader sees the old or the new content, never a part). Blocking."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def make_key_and_csr(node_id: str) -> tuple[bytes, bytes]:
    """A new private key and a certificate signing request for `node_id`: (key PEM, CSR PEM).

    Run on the node; only the CSR travels. Not a checkpoint (about 1 ms of CPU).
    """
    if not node_id:
        raise WireError("a node id is needed to request a node certificate; give --node-id or set the hostname.")
    key = _new_key()
    csr = x509.CertificateSigningRequestBuilder().subject_name(_name(node_id)).sign(key, hashes.SHA256())
    return _key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


@lru_cache(maxsize=1024)
def _parsed(cert_pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(cert_pem)


def certificate_common_name(cert_pem: bytes) -> str:
    """The subject common name of a PEM certificate ("" if it has none)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def certificate_validity(cert_pem: bytes) -> tuple[float, float]:
    """(not before, not after) of a PEM certificate, unix seconds. Raises WireError when it does not parse."""
    try:
        cert = _parsed(cert_pem)
    except ValueError as exc:
        raise WireError(f"a certificate does not parse ({exc}).") from exc
    return _not_before(cert), _not_after(cert)


def check_renewed(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, node_id: str) -> float:
    """Check a renewed node certificate before it replaces the old one: it parses, names `node_id`, holds the public
    key of `key_pem` (the key the node made for its request) and is signed by the CA `ca_pem`. Returns its end (unix
    seconds). Raises WireError saying which check failed. Not a checkpoint (about 1 ms)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError as exc:
        raise WireError(f"the renewed certificate does not parse ({exc}); the old one stays in use.") from exc
    if certificate_common_name(cert_pem) != node_id:
        raise WireError(f"the renewed certificate names {certificate_common_name(cert_pem)!r}, not this node "
                        f"{node_id!r}; the old one stays in use.")
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if (cert.public_key().public_bytes(serialization.Encoding.DER, public)
            != key.public_key().public_bytes(serialization.Encoding.DER, public)):
        raise WireError("the renewed certificate is not for the key this node asked with; the old one stays in use.")
    if not signed_by_any(cert_pem, ca_pem):
        raise WireError("the renewed certificate is not signed by this node's CA (ca.crt); the old one stays in "
                        "use.")
    return _not_after(cert)


@lru_cache(maxsize=4096)
def signed_by_any(cert_pem: bytes, cas_pem: bytes) -> bool:
    """True when the certificate `cert_pem` was signed by one of the CA certificates in the PEM bundle `cas_pem`
    (False when either does not parse). Cached: about 0.1 ms per new pair."""
    try:
        cert = _parsed(cert_pem)
        cas = x509.load_pem_x509_certificates(cas_pem)
    except ValueError:
        return False
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):
            continue
    return False


NEXT_CERT_FILE = "node.next.crt"
NEXT_KEY_FILE = "node.next.key"


def install_renewed(directory: str | os.PathLike[str], cert_pem: bytes, key_pem: bytes) -> None:
    """Replace `node.crt` and `node.key` in `directory` by a renewed pair, so that a crash at any point leaves a
    matching pair: both are written whole first (`node.next.crt`, `node.next.key` 0600), then renamed over the old
    ones, the key first; `finish_renewal` completes a swap a crash interrupted. Blocking."""
    path = Path(directory)
    _write_private(path / NEXT_KEY_FILE, key_pem)
    _write_private(path / NEXT_CERT_FILE, cert_pem)
    finish_renewal(path)


def finish_renewal(directory: str | os.PathLike[str]) -> None:
    """Complete a renewal `install_renewed` began in `directory`: a `node.next.key` is renamed over `node.key`, then
    a `node.next.crt` over `node.crt` (the next files are only ever there whole). Nothing to do: no change."""
    path = Path(directory)
    if (path / NEXT_KEY_FILE).exists():
        if not (path / NEXT_CERT_FILE).exists():  # the certificate's file was never written whole: not begun
            (path / NEXT_KEY_FILE).unlink()
            return
        os.replace(path / NEXT_KEY_FILE, path / "node.key")
    if (path / NEXT_CERT_FILE).exists():
        os.replace(path / NEXT_CERT_FILE, path / "node.crt")


def _make_ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _load_ca(key_path: Path, cert_path: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (ValueError, OSError) as exc:
        raise WireError(f"the CA in {key_path.parent} does not load ({exc}); restore {key_path} and "
                        f"{cert_path}.") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise WireError(f"{key_path} is not an ECDSA key; restore the CA files or move them away to make a new CA.")
    return key, cert


def _finish_ca_swap(path: Path) -> None:
    """Complete what a crash interrupted in `path`: a new CA's key written without its certificate (a rotation not
    begun) is removed; a new CA's certificate without its key (a retirement after the key's rename) is renamed
    over `ca.crt`. Blocking."""
    key, cert = path / NEXT_CA_KEY_FILE, path / NEXT_CA_CERT_FILE
    if key.exists() and not cert.exists():
        key.unlink()
    elif cert.exists() and not key.exists():
        os.replace(cert, path / CA_CERT_FILE)


def _ca_files_seen(path: Path) -> tuple[Any, ...]:
    """What a stat of the CA's certificate files says (changed by a rotation or a retirement)."""
    seen: list[Any] = []
    for name in (CA_CERT_FILE, NEXT_CA_CERT_FILE):
        try:
            info = (path / name).stat()
            seen.append((info.st_mtime_ns, info.st_size, info.st_ino))
        except FileNotFoundError:
            seen.append(None)
    return tuple(seen)


class CertificateAuthority:
    """The control plane's CA, kept in `directory` (see the module docstring for the files)."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self.directory = directory
        self._key = key
        self.certificate = certificate
        self._nodes_cache: tuple[tuple[int, int, int], dict[str, Any]] | None = None
        self.next: tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None = None  # the new CA while rotating
        self._seen: tuple[Any, ...] = ()
        self.generation = 0  # counts the changes of the CAs (rotate, retire, or either seen by `refresh`)

    @classmethod
    def load_or_create(cls, directory: str | os.PathLike[str], name: str = "llmgw control plane CA") -> CertificateAuthority:
        """Load the CA from `directory`, or create it there (directory mode 0700, key file 0600) if absent.

        Raises: WireError if only one of ca.key / ca.crt exists or they do not load (the message names the file).
        """
        path = Path(directory)
        key_path, cert_path = path / CA_KEY_FILE, path / CA_CERT_FILE
        _finish_ca_swap(path)
        if key_path.exists() and cert_path.exists():
            ca = cls(path, *_load_ca(key_path, cert_path))
            if (path / NEXT_CA_KEY_FILE).exists():  # a rotation is under way: the new CA beside the old one
                ca.next = _load_ca(path / NEXT_CA_KEY_FILE, path / NEXT_CA_CERT_FILE)
            ca._seen = _ca_files_seen(path)
            return ca
        if key_path.exists() or cert_path.exists():
            raise WireError(
                f"{path} holds only one of {CA_KEY_FILE} and {CA_CERT_FILE}; restore the other, or remove both "
                "to make a new CA (every node then has to join again)."
            )
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        key, cert = _make_ca(name)
        _write_private(key_path, _key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        ca = cls(path, key, cert)
        ca._seen = _ca_files_seen(path)
        return ca

    @property
    def not_after(self) -> float:
        """When the CA certificate ends (unix seconds): every certificate it signed stops verifying then."""
        return _not_after(self.certificate)

    @property
    def next_not_after(self) -> float | None:
        """When the new CA of a rotation under way ends (unix seconds); None when none is."""
        return _not_after(self.next[1]) if self.next is not None else None

    @property
    def rotating(self) -> bool:
        """A new CA stands beside the old one (`rotate`), not yet retired."""
        return self.next is not None

    @property
    def certificate_pem(self) -> bytes:
        """The CA certificates agents trust (PEM; the old and the new one while rotating): what they need to join,
        and what verifies their certificates."""
        pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        return pem + self.next[1].public_bytes(serialization.Encoding.PEM) if self.next is not None else pem

    @property
    def signing_certificate_pem(self) -> bytes:
        """The CA certificate that signs node certificates now (the new one while rotating)."""
        return self._signer[1].public_bytes(serialization.Encoding.PEM)

    @property
    def _signer(self) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        return self.next if self.next is not None else (self._key, self.certificate)

    def _issue(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, usage: x509.ObjectIdentifier, days: int,
        sans: list[x509.GeneralName], *, node: bool = False,
    ) -> bytes:
        """A certificate signed by the old CA (server certificates, which every agent trusts) or, for a `node`, by
        the CA that signs now (`_signer`)."""
        key, issuer = self._signer if node else (self._key, self.certificate)
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def issue_server_certificate(self, hostnames_and_ips: Sequence[str], days: int = SERVER_DAYS) -> tuple[bytes, bytes]:
        """A server certificate and key for the control plane: (cert PEM, key PEM).

        `hostnames_and_ips` are the names agents dial (each becomes a DNS or IP subject alternative name;
        the first is also the common name). Raises: WireError if the list is empty.
        """
        if not hostnames_and_ips:
            raise WireError("a server certificate needs at least one host name or IP address that agents dial.")
        sans: list[x509.GeneralName] = []
        for item in hostnames_and_ips:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(item)))
            except ValueError:
                sans.append(x509.DNSName(item))
        key = _new_key()
        cert = self._issue(_name(hostnames_and_ips[0]), key.public_key(), ExtendedKeyUsageOID.SERVER_AUTH, days, sans)
        return cert, _key_pem(key)

    def sign_csr(self, csr_pem: bytes, node_id: str, days: int = NODE_DAYS, *, replace: bool = False) -> bytes:
        """Sign a node's CSR (from make_key_and_csr) as a client certificate whose common name is `node_id`.

        Records nothing: call `record_certificate` once the certificate is handed out (after the join token was
        accepted), so that `revoke` knows its serial.
        Raises: WireError if the CSR does not parse, its signature is wrong, its key is not ECDSA/RSA, or it names
        another node; CertificateExists (a WireError) when `node_id` holds a live certificate and not `replace`.
        """
        if not replace:
            self.check_no_live_certificate(node_id)
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise WireError(f"the certificate request of node {node_id!r} does not parse: {exc}") from exc
        try:
            valid = csr.is_signature_valid
        except InvalidSignature:
            valid = False
        if not valid:
            raise WireError(f"the certificate request of node {node_id!r} has an invalid signature.")
        names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names or names[0].value != node_id:
            asked = names[0].value if names else "no name"
            raise WireError(f"the certificate request names {asked!r}, not the joining node {node_id!r}.")
        public_key = csr.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise WireError(f"the certificate request of node {node_id!r} must use an ECDSA key.")
        return self._issue(_name(node_id), public_key, ExtendedKeyUsageOID.CLIENT_AUTH, days, [], node=True)

    # Rotation --------------------------------------------------------------------------------------------

    def rotate(self, name: str | None = None) -> None:
        """Make a new CA beside this one (`ca.next.key` 0600, then `ca.next.crt`): it signs node certificates from
        now on, both are trusted until `retire`. Blocking. Raises WireError when a rotation is under way already."""
        if self.next is not None:
            raise WireError(f"a new CA already stands beside the old one in {self.directory} (valid until "
                            f"{time.strftime('%Y-%m-%d', time.gmtime(_not_after(self.next[1])))}); wait for the old "
                            "one's retirement (`llmgw status`) or retire it now with `llmgw ca rotate --finish`.")
        key, cert = _make_ca(name or f"llmgw control plane CA {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}")
        _write_private(self.directory / NEXT_CA_KEY_FILE, _key_pem(key))
        write_file(self.directory / NEXT_CA_CERT_FILE, cert.public_bytes(serialization.Encoding.PEM))
        self.next = (key, cert)
        self._seen = _ca_files_seen(self.directory)
        self.generation += 1

    def retire(self) -> None:
        """End a rotation: the new CA replaces the old one (`ca.next.key` renamed over `ca.key`, then `ca.next.crt`
        over `ca.crt`), so certificates of the old one are refused from now on. Blocking. Raises WireError when no
        rotation is under way."""
        if self.next is None:
            raise WireError(f"no new CA stands beside the old one in {self.directory}; start a rotation with "
                            "`llmgw ca rotate`.")
        os.replace(self.directory / NEXT_CA_KEY_FILE, self.directory / CA_KEY_FILE)
        os.replace(self.directory / NEXT_CA_CERT_FILE, self.directory / CA_CERT_FILE)
        (self._key, self.certificate), self.next = self.next, None
        self._seen = _ca_files_seen(self.directory)
        self.generation += 1

    def refresh(self) -> bool:
        """Read the CA's files again when `llmgw ca rotate` (another process) changed them: True when they changed.
        Blocking (two stats, and a read after a change). Raises WireError when they do not load."""
        if _ca_files_seen(self.directory) == self._seen:
            return False
        fresh = CertificateAuthority.load_or_create(self.directory)
        self._key, self.certificate, self.next, self._seen = fresh._key, fresh.certificate, fresh.next, fresh._seen
        self.generation += 1
        return True

    def certificate_refusal(self, certificate_pem: bytes) -> str | None:
        """Why the node certificate `certificate_pem` is no longer accepted, or None: revoked (`revoke`), or signed
        by a CA this one does not trust (retired by a rotation). Blocking (one stat). Raises WireError when
        nodes.json does not parse."""
        if not signed_by_any(certificate_pem, self.certificate_pem):
            return (f"the certificate of node {certificate_common_name(certificate_pem)!r} is signed by a CA this "
                    "control plane no longer trusts (retired by `llmgw ca rotate`); the agent connects again with "
                    "the certificate it renewed under the new CA, or joins again with a new join token.")
        if self.is_certificate_revoked(certificate_pem):
            return (f"the certificate of node {certificate_common_name(certificate_pem)!r} was revoked on the "
                    "control plane (`llmgw node revoke`); the node has to join again with a new join token.")
        return None

    def rotation_progress(self, connected: Sequence[str] = ()) -> dict[str, Any] | None:
        """While rotating: which nodes still wait for a certificate of the new CA. A node waits when it holds a
        live certificate of the old CA on record, or is `connected` now, and holds none of the new CA on record.
        {"new_ca_until": date, "new_ca_not_after": unix seconds, "nodes": n, "moved": m, "waiting": [ids]}; None
        when no rotation is under way. Blocking (reads nodes.json)."""
        if self.next is None:
            return None
        new = format(self.next[1].serial_number, "x")
        now = time.time()
        moved, old = set(), set(connected)
        for node_id, entry in self._nodes_snapshot().items():
            for issued in self._live(entry, now):
                (moved if issued.get("ca") == new else old).add(node_id)
        nodes = moved | old
        end = _not_after(self.next[1])
        return {"new_ca_until": time.strftime("%Y-%m-%d", time.gmtime(end)), "new_ca_not_after": end,
                "nodes": len(nodes), "moved": len(moved), "waiting": sorted(old - moved)}

    # Issued and revoked node certificates ----------------------------------------------------------------

    def _nodes_snapshot(self) -> dict[str, Any]:
        """`nodes.json` as read now (cached while the file's size and mtime stay the same); {} when absent.
        One stat per call. Raises WireError when the file cannot be read or does not parse."""
        path = self.directory / NODES_FILE
        try:
            info = path.stat()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise WireError(f"{path} cannot be read ({exc}); it holds which node certificates are revoked") from exc
        key = (info.st_mtime_ns, info.st_size, info.st_ino)
        if self._nodes_cache is not None and self._nodes_cache[0] == key:
            return self._nodes_cache[1]
        try:
            table = json.loads(path.read_text())
        except (ValueError, OSError) as exc:
            raise WireError(f"{path} is unreadable ({exc}); restore it from a backup: it holds which node "
                            "certificates are revoked.") from exc
        self._nodes_cache = (key, table)
        return table

    def _live(self, entry: dict[str, Any], now: float) -> list[dict[str, Any]]:
        return [issued for issued in entry.get("issued", []) if issued["not_after"] > now]

    def _usable(self, entry: dict[str, Any], now: float) -> list[dict[str, Any]]:
        """The live certificates of `entry` signed by a CA trusted now (one of a retired CA counts no more)."""
        trusted = {format(self.certificate.serial_number, "x")}
        if self.next is not None:
            trusted.add(format(self.next[1].serial_number, "x"))
        return [issued for issued in self._live(entry, now) if issued.get("ca", min(trusted)) in trusted]

    def check_no_live_certificate(self, node_id: str) -> None:
        """Raise CertificateExists when `node_id` holds a certificate on record that is neither revoked nor
        expired nor of a retired CA. Blocking (reads nodes.json)."""
        live = self._usable(self._nodes_snapshot().get(node_id, {}), time.time())
        if live:
            until = time.strftime("%Y-%m-%d", time.gmtime(max(issued["not_after"] for issued in live)))
            raise CertificateExists(
                f"node {node_id!r} already has a certificate (valid until {until}); a second machine may not join "
                f"under its id. If it is the same node with a new key, revoke the old certificate on the control "
                f"plane first (`llmgw node revoke {node_id}`), then join again."
            )

    def live_certificates(self, node_id: str) -> int:
        """How many certificates of `node_id` on record are neither revoked nor expired nor of a retired CA.
        Blocking (reads nodes.json)."""
        return len(self._usable(self._nodes_snapshot().get(node_id, {}), time.time()))

    def record_certificate(self, node_id: str, certificate_pem: bytes) -> None:
        """Note in nodes.json that `certificate_pem` was issued to `node_id` (its serial and validity). Blocking."""
        cert = x509.load_pem_x509_certificate(certificate_pem)
        with self._table(NODES_FILE, "the record of issued and revoked certificates is lost") as table:
            entry = table.setdefault(node_id, {})
            now = time.time()
            entry["issued"] = [issued for issued in entry.get("issued", []) if issued["not_after"] > now] + [
                {"serial": format(cert.serial_number, "x"), "not_before": _not_before(cert),
                 "not_after": _not_after(cert), "ca": self._issuer_serial(certificate_pem)}]

    def _issuer_serial(self, certificate_pem: bytes) -> str:
        """The serial (hex) of the CA, the new one or the old, that signed `certificate_pem`."""
        if self.next is not None and signed_by_any(certificate_pem, self.next[1].public_bytes(serialization.Encoding.PEM)):
            return format(self.next[1].serial_number, "x")
        return format(self.certificate.serial_number, "x")

    def revoke(self, node_id: str, now: float | None = None) -> int:
        """Revoke every certificate of `node_id` issued until now (`now`: unix seconds, default the clock).

        The certificates on record are revoked by serial; one issued before the record existed (none on record
        for it) is revoked when it started before `now`. Returns how many certificates on record that revoked.
        The agents' server refuses them from its next check on (at most REVOCATION_CHECK_SECONDS). The node may
        join again with a new join token. Blocking.
        """
        now = time.time() if now is None else now
        with self._table(NODES_FILE, "the record of issued and revoked certificates is lost") as table:
            entry = table.setdefault(node_id, {})
            live = self._live(entry, now)
            entry["revoked"] = [revoked for revoked in entry.get("revoked", []) if revoked["not_after"] > now] + live
            entry["issued"] = []
            entry["revoked_before"] = max(float(entry.get("revoked_before", 0.0)), now)
        return len(live)

    def is_certificate_revoked(self, certificate_pem: bytes) -> bool:
        """True when the node certificate `certificate_pem` was revoked (`revoke`).

        By serial for certificates on record; a certificate not on record (issued before the record existed) is
        revoked when it started at or before its node's last revocation. One stat per call (nodes.json is re-read
        only when it changed). Raises WireError when nodes.json does not parse.
        """
        cert = _parsed(certificate_pem)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names:
            return True
        entry = self._nodes_snapshot().get(str(names[0].value), {})
        serial = format(cert.serial_number, "x")
        if any(revoked["serial"] == serial for revoked in entry.get("revoked", [])):
            return True
        if any(issued["serial"] == serial for issued in entry.get("issued", [])):
            return False
        revoked_before = entry.get("revoked_before")
        return revoked_before is not None and _not_before(cert) <= revoked_before

    def is_revoked(self, name: str) -> bool:
        """True when node `name` was revoked and has not joined again since (no certificate of it is live on
        record). For callers that know only the certificate's common name (`Link.peer_certificate_name`); the
        agents' server itself checks the certificate (`is_certificate_revoked`). Blocking (one stat)."""
        entry = self._nodes_snapshot().get(name, {})
        return "revoked_before" in entry and not self._live(entry, time.time())

    def server_tls(self, hostnames_and_ips: Sequence[str]) -> ServerTls:
        """ServerTls for `serve_agents`, with a fresh server certificate for `hostnames_and_ips`."""
        cert, key = self.issue_server_certificate(hostnames_and_ips)
        return ServerTls(certificate_pem=cert, key_pem=key, ca_pem=self.certificate_pem)

    # Join tokens -----------------------------------------------------------------------------------------

    @contextmanager
    def _table(self, name: str, lost: str) -> Iterator[dict[str, Any]]:
        """The JSON object in `<directory>/<name>`, locked against other processes, saved on exit when changed.
        Raises WireError naming the file when it does not parse (`lost`: what removing it loses)."""
        with open(self.directory / (name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.directory / name
            try:
                table = json.loads(path.read_text()) if path.exists() else {}
            except (ValueError, OSError) as exc:
                raise WireError(f"{path} is unreadable ({exc}); remove it ({lost}).") from exc
            before = json.dumps(table, sort_keys=True)
            yield table
            if json.dumps(table, sort_keys=True) != before:
                _write_private(path, json.dumps(table, indent=1, sort_keys=True).encode())

    @contextmanager
    def _tokens(self) -> Iterator[dict[str, float]]:
        """The token table {sha256 hex: expiry unix seconds}, expired tokens dropped, locked and saved on exit."""
        with self._table(TOKENS_FILE, "outstanding join tokens are lost") as table:
            now = time.time()
            for digest in [digest for digest, expiry in table.items() if expiry <= now]:
                del table[digest]
            yield table

    def create_join_token(self, ttl_seconds: float = 3600.0) -> str:
        """A new one-time join token valid for `ttl_seconds`; only its SHA-256 is stored. Give it to the node.

        Raises: UsageError unless 0 < ttl_seconds <= MAX_JOIN_TOKEN_TTL (7 days; NaN and infinities refused).
        """
        if not math.isfinite(ttl_seconds) or not 0 < ttl_seconds <= MAX_JOIN_TOKEN_TTL:
            raise UsageError(f"A join token lives more than 0 and at most {MAX_JOIN_TOKEN_TTL:g} seconds (7 days), "
                             f"not {ttl_seconds}.")
        token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._tokens() as table:
            table[hashlib.sha256(token.encode()).hexdigest()] = time.time() + ttl_seconds
        return token

    def consume_join_token(self, token: str) -> bool:
        """True if `token` is known and unexpired; it is removed either way, so it never works twice."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._tokens() as table:
            return table.pop(digest, None) is not None


@dataclass(frozen=True)
class ServerTls:
    """The control plane's TLS material (PEM bytes): its certificate and key, and the CA that signs nodes."""

    certificate_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    latest: Callable[[], ServerTls] | None = field(default=None, compare=False)
    """None: this material for good. Else asked at every TLS handshake for the material to use now (a CA rotation
    changes it: `AgentsTls`); must not block."""

    def _configuration(self, require_client_certificate: bool) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(self.key_pem, self.certificate_pem)], root_certificates=self.ca_pem if require_client_certificate else None)

    def credentials(self, *, require_client_certificate: bool = True) -> grpc.ServerCredentials:
        """gRPC server credentials; with `require_client_certificate`, clients must show a CA-signed certificate.
        With `latest`, each new connection gets the material `latest()` gives then (open ones keep theirs)."""
        if self.latest is None:
            return grpc.ssl_server_credentials(
                [(self.key_pem, self.certificate_pem)],
                root_certificates=self.ca_pem if require_client_certificate else None,
                require_client_auth=require_client_certificate,
            )
        latest, served = self.latest, [self]

        def fetch() -> Any:  # gRPC's thread, at each handshake: None keeps the material served last
            now = latest()
            if now is served[0]:
                return None
            served[0] = now
            return now._configuration(require_client_certificate)

        return grpc.dynamic_ssl_server_credentials(self._configuration(require_client_certificate), fetch,
                                                   require_client_authentication=require_client_certificate)


class AgentsTls:
    """The agents' listener's TLS material under `ca`, for `hostnames_and_ips`, kept current through a rotation:
    `refresh` (blocking) reads the CA's files again and, when they changed, issues a new server certificate (the
    old CA's while rotating, the new one's after) with the trust bundle of now; `server_tls()` is what
    `serve_agents` takes (its connections from then on get `current`)."""

    def __init__(self, ca: CertificateAuthority, hostnames_and_ips: Sequence[str]) -> None:
        self.ca, self.names = ca, list(hostnames_and_ips)
        self.current = self._make()
        self._generation = ca.generation

    def _make(self) -> ServerTls:
        cert, key = self.ca.issue_server_certificate(self.names)
        return ServerTls(certificate_pem=cert, key_pem=key, ca_pem=self.ca.certificate_pem, latest=lambda: self.current)

    def server_tls(self) -> ServerTls:
        """The material of now, following `current` at every new connection."""
        return self.current

    def refresh(self) -> bool:
        """True when the CA changed since the last call, here or in its files (and `current` with it). Blocking.
        Raises WireError when the CA does not load."""
        self.ca.refresh()
        if self.ca.generation == self._generation:
            return False
        self._generation = self.ca.generation
        self.current = self._make()
        return True


@dataclass(frozen=True)
class ClientTls:
    """An agent's TLS material (PEM bytes): the CA it trusts and, after joining, its own certificate and key.

    `server_name` overrides the name checked in the server certificate (None: the host part of the address).
    """

    ca_pem: bytes
    certificate_pem: bytes | None = None
    key_pem: bytes | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials (mutual when a certificate and key are set, server-verified only otherwise)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.certificate_pem
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Extra channel options (the server name override, if any)."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ClientTls:
        """Read `ca.crt`, `node.crt` and `node.key` written by `save` (a renewal a crash interrupted completed first:
        `finish_renewal`). Raises: WireError naming a missing file."""
        path = Path(directory)
        if path.is_dir():
            finish_renewal(path)
        try:
            return cls(
                ca_pem=(path / "ca.crt").read_bytes(),
                certificate_pem=(path / "node.crt").read_bytes(),
                key_pem=(path / "node.key").read_bytes(),
            )
        except FileNotFoundError as exc:
            raise WireError(
                f"{exc.filename} is missing: this node has not joined yet; run `llmgw node join` with a join token."
            ) from exc

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write `ca.crt`, `node.crt` and `node.key` (mode 0600) into `directory` (created 0700 if absent)."""
        if self.certificate_pem is None or self.key_pem is None:
            raise WireError("this ClientTls has no node certificate to save; join first.")
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        (path / "ca.crt").write_bytes(self.ca_pem)
        (path / "node.crt").write_bytes(self.certificate_pem)
        _write_private(path / "node.key", self.key_pem)
