r"""Bundle signatures and break-glass signatures: Ed25519 (RFC 8032) with ``cryptography``.

What is signed (docs/bundles.md#signed-bundles): the SHA-256 digest of a bundle's canonical
form, which is the text ::

    svc-bundle-v1
    version <version in decimal>
    <sha256 hex of file 1's UTF-8 bytes>  <file 1's name>
    <sha256 hex of file 2's UTF-8 bytes>  <file 2's name>
    ...

one line each, ``\n``-terminated, files sorted by the UTF-8 bytes of their names. Names are
flat (no ``/``), hold no control characters, and are unique, so the form is unambiguous. The
policy service signs on publish (``sign_bundle``); a decision point checks with ``verify``
before it serves a bundle (``svc.pdp.follower``).

A break-glass request (docs/policy.md#break-glass) signs the text ::

    svc-break-glass-v1
    version <version>
    admin <admin>
    nonce <nonce>
    issued_at <unix seconds>
    reason <reason as JSON string>

Keys: private keys are PKCS #8 PEM files (``generate_keypair``, ``svc policy keygen``); public
keys are SubjectPublicKeyInfo PEM or the base64 of the raw 32 bytes. A key's id is the first 16
hex digits of SHA-256 of its raw public bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "SignatureError",
    "break_glass_message",
    "bundle_digest",
    "canonical_bundle",
    "check_file_name",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_key_text",
    "sign_break_glass",
    "sign_bundle",
    "verify",
    "verify_break_glass",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class SignatureError(ValueError):
    """A signature does not verify (wrong key, tampered bundle, malformed signature)."""


def check_file_name(name: str) -> None:
    r"""Checks a bundle file name.

    1 to 255 characters, no ``/`` or ``\``, no control characters, not ``.`` or ``..``.

    Raises:
        ValueError: naming what is wrong.

    """
    if not name or len(name) > 255:
        raise ValueError(f"file name `{name[:40]}`: must be 1 to 255 characters")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"file name `{name}`: a bundle is flat, no directories")
    if _CONTROL.search(name):
        raise ValueError(f"file name {name!r}: control characters are not allowed")


def canonical_bundle(version: int, files: Mapping[str, str]) -> bytes:
    """The canonical form of a bundle (module docs).

    Args:
        version: the bundle's version (a positive integer).
        files: file name to UTF-8 text.

    Returns:
        The canonical text as bytes.

    Raises:
        ValueError: a file name is not allowed (``check_file_name``).

    """
    lines = ["svc-bundle-v1", f"version {int(version)}"]
    for name in sorted(files, key=lambda n: n.encode()):
        check_file_name(name)
        lines.append(f"{hashlib.sha256(files[name].encode()).hexdigest()}  {name}")
    return ("\n".join(lines) + "\n").encode()


def bundle_digest(version: int, files: Mapping[str, str]) -> bytes:
    """SHA-256 (32 bytes) of ``canonical_bundle(version, files)``; what the signature covers."""
    return hashlib.sha256(canonical_bundle(version, files)).digest()


def key_id(public_key: Ed25519PublicKey) -> str:
    """The first 16 hex digits of SHA-256 of the key's raw 32 bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(private_path: Path, public_path: Path | None = None) -> Ed25519PublicKey:
    """Makes an Ed25519 key pair; writes the private key as PKCS #8 PEM (mode 0600).

    Args:
        private_path: the private key's file; must not exist.
        public_path: the public key's file (SubjectPublicKeyInfo PEM); default
            ``<private_path>.pub``.

    Returns:
        The public key.

    Raises:
        FileExistsError: ``private_path`` exists (a key is never overwritten).
        OSError: a file cannot be written.

    """
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key()
    (public_path or private_path.with_name(private_path.name + ".pub")).write_text(
        public_key_text(pub), encoding="ascii"
    )
    return pub


def public_key_text(public_key: Ed25519PublicKey) -> str:
    """The key as SubjectPublicKeyInfo PEM text."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Reads a PKCS #8 PEM Ed25519 private key (unencrypted).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not an unencrypted Ed25519 private key.

    """
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 key ({type(key).__name__})")
    return key


def load_public_key(text: str | bytes) -> Ed25519PublicKey:
    """Parses an Ed25519 public key: SubjectPublicKeyInfo PEM, or base64 of the raw 32 bytes.

    Raises:
        ValueError: the text is neither, or the key is not Ed25519.

    """
    data = text.encode() if isinstance(text, str) else text
    if b"-----BEGIN" in data:
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as e:
            raise ValueError(f"not a PEM public key ({e})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"not an Ed25519 key ({type(key).__name__})")
        return key
    try:
        raw = base64.b64decode(data.strip(), validate=True)
    except binascii.Error:
        raise ValueError("neither PEM nor base64") from None
    if len(raw) != 32:
        raise ValueError(f"a raw Ed25519 public key has 32 bytes, this one {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def sign_bundle(key: Ed25519PrivateKey, version: int, files: Mapping[str, str]) -> bytes:
    """Signs ``bundle_digest(version, files)``; returns the 64-byte Ed25519 signature."""
    return key.sign(bundle_digest(version, files))


def verify(
    public_key: Ed25519PublicKey, version: int, files: Mapping[str, str], signature: bytes
) -> None:
    """Checks a bundle's signature, as a decision point does before it serves the bundle.

    Args:
        public_key: the policy service's public key.
        version: the bundle's version, as received.
        files: the bundle's files, as received.
        signature: the 64-byte signature, as received.

    Raises:
        SignatureError: the signature is missing or does not match this version and these
            files under this key (a tampered bundle or signature, or another key).

    """
    if not signature:
        raise SignatureError(f"bundle version {version} carries no signature")
    try:
        public_key.verify(signature, bundle_digest(version, files))
    except InvalidSignature:
        raise SignatureError(
            f"the signature of bundle version {version} does not verify with key "
            f"{key_id(public_key)} (the bundle or its signature was altered, or another key "
            "signed it)"
        ) from None
    except ValueError as e:  # a bad file name
        raise SignatureError(f"bundle version {version}: {e}") from None


def break_glass_message(version: int, admin: str, nonce: str, issued_at: int, reason: str) -> bytes:
    """The bytes a break-glass request signs (module docs)."""
    return (
        f"svc-break-glass-v1\nversion {int(version)}\nadmin {admin}\nnonce {nonce}\n"
        f"issued_at {int(issued_at)}\nreason {json.dumps(reason)}\n"
    ).encode()


def sign_break_glass(
    key: Ed25519PrivateKey, version: int, admin: str, nonce: str, issued_at: int, reason: str
) -> bytes:
    """Signs a break-glass request (``svc policy rollback --key FILE``); 64 bytes."""
    return key.sign(break_glass_message(version, admin, nonce, issued_at, reason))


def verify_break_glass(
    public_key: Ed25519PublicKey,
    version: int,
    admin: str,
    nonce: str,
    issued_at: int,
    reason: str,
    signature: bytes,
) -> None:
    """Checks a break-glass request's signature.

    Raises:
        SignatureError: it does not verify under ``public_key``.

    """
    try:
        public_key.verify(signature, break_glass_message(version, admin, nonce, issued_at, reason))
    except InvalidSignature:
        raise SignatureError(
            f"the break-glass signature does not verify with `{admin}`'s key"
        ) from None
