"""Signed, single-use links to the challenge page (docs/challenges.md#link-tokens).

A notification carries ``<page_url>/<qid>?t=<token>``. The token is a JWT (RFC 7519) signed with
HMAC-SHA256 (``HS256``, RFC 7518 section 3.2) through PyJWT, with the key of the
``link_key_file`` setting, and binds the link to one challenge (``qid``), one recipient
(``sub``: the user name the notification addresses) and one event (``evt``: ``opened``,
``forwarded``, ...), with an expiry (``exp``) and an id (``jti``). The page records the ``jti``
when the link is used (``ChallengeService.use_link``), so a link opens the page once.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt
import uuid_utils

__all__ = ["LINK_AUDIENCE", "LinkClaims", "LinkRefused", "LinkTokens"]

log = logging.getLogger("svc.challenge")

#: The ``aud`` of every link token: no other svc token verifies as one, nor one as another.
LINK_AUDIENCE = "svc-challenge-page"
_ALGORITHM = "HS256"
#: Bytes of a generated key (RFC 7518 section 3.2: at least the hash's 32).
_KEY_BYTES = 32


class LinkRefused(Exception):
    """A link token that does not verify: tampered, another key, expired, another challenge."""


@dataclass(frozen=True)
class LinkClaims:
    """What a verified link token says: the challenge, its recipient, the event, its id."""

    qid: str
    recipient: str
    event: str
    jti: str
    expires_at: datetime


class LinkTokens:
    """Makes and verifies link tokens with one HMAC key.

    Args:
        key: the HMAC key, at least 32 bytes.
        ttl_secs: how long a token is valid after it is made (seconds, > 0).

    Raises:
        ValueError: the key is shorter than 32 bytes or ``ttl_secs`` is not positive.

    """

    def __init__(self, key: bytes, ttl_secs: int) -> None:
        if len(key) < _KEY_BYTES:
            raise ValueError(f"a link key holds at least {_KEY_BYTES} bytes")
        if ttl_secs <= 0:
            raise ValueError("ttl_secs must be positive")
        self._key = key
        self.ttl = timedelta(seconds=ttl_secs)

    @property
    def key(self) -> bytes:
        """The HMAC key (the page derives its session-cookie key from it)."""
        return self._key

    @classmethod
    def from_file(cls, path: str | None, ttl_secs: int) -> LinkTokens:
        """Tokens signed with the key in ``path``, made there first when the file is missing.

        Args:
            path: the key file (raw bytes, or text that is used as its UTF-8 bytes; surrounding
                whitespace dropped); None: a random key held in memory only, so links end with
                the process (and replicas cannot verify each other's).
            ttl_secs: as the constructor's.

        Returns:
            The token maker.

        Raises:
            OSError: the file can neither be read nor made.
            ValueError: the key in the file is shorter than 32 bytes.

        """
        if path is None:
            log.info("no link_key_file: challenge-page links end with this process")
            return cls(secrets.token_bytes(_KEY_BYTES), ttl_secs)
        p = Path(path)
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_urlsafe(_KEY_BYTES) + "\n")
            log.info("made the link key %s", p)
        return cls(p.read_bytes().strip(), ttl_secs)

    def mint(self, qid: str, recipient: str, event: str, now: datetime) -> str:
        """A token for one challenge, recipient and event, valid ``ttl_secs`` from ``now``.

        Args:
            qid: the challenge's qid.
            recipient: the user name the notification addresses.
            event: the notification's event (``opened``, ``forwarded``, ...).
            now: aware UTC time the token is made at.

        Returns:
            The compact JWS (URL-safe characters only).

        """
        claims = {
            "aud": LINK_AUDIENCE,
            "qid": qid,
            "sub": recipient,
            "evt": event,
            "jti": str(uuid_utils.uuid7()),
            "iat": int(now.timestamp()),
            "exp": int((now + self.ttl).timestamp()),
        }
        return jwt.encode(claims, self._key, algorithm=_ALGORITHM)

    def verify(self, token: str, qid: str) -> LinkClaims:
        """Checks a token's signature, audience, expiry and challenge.

        Args:
            token: the ``t`` query parameter of the link.
            qid: the challenge the link's path names.

        Returns:
            The token's claims.

        Raises:
            LinkRefused: the token is malformed, signed with another key, expired, for another
                audience or for another challenge.

        """
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=[_ALGORITHM],
                audience=LINK_AUDIENCE,
                options={"require": ["exp", "jti", "sub", "qid", "evt"]},
            )
        except jwt.PyJWTError as e:
            raise LinkRefused(f"the link does not verify: {e}") from None
        if claims["qid"] != qid:
            raise LinkRefused("the link is for another challenge")
        return LinkClaims(
            qid=str(claims["qid"]),
            recipient=str(claims["sub"]),
            event=str(claims["evt"]),
            jti=str(claims["jti"]),
            expires_at=datetime.fromtimestamp(int(claims["exp"]), tz=UTC),
        )
