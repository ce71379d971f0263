"""A development issuer of agent tokens for ``svc up``'s demo and the tests: never for an install.

Agents present their own tokens to the gateway (docs/architecture.md#agent-tokens), signed by an
app trusted to sign for its service accounts (docs/architecture.md#trusted-app-issuers). A real
install trusts the apps that run its agents; the demo has none, so ``DevTokenIssuer`` plays
them: one trusted app per prefix of the demo company's AI agents (``copilot``, ``helpdesk``,
``crm``, ``docs``; ``svc.demo.company.SERVICE_ACCOUNTS``), each with

* its own ES256 (P-256) key, made on the first start and kept in ``<directory>/<app>.pem``
  (PKCS #8, mode 0600) so a token minted by another process (``svc demo token``) verifies;
* ``iss`` ``https://<host>:<port>/<app>`` and its JWK Set (RFC 7517, ``kid`` the key's RFC 7638
  thumbprint) at ``https://<host>:<port>/<app>/jwks.json``, served over HTTPS with a certificate
  signed by a self-signed CA made with ``cryptography``; the CA's certificate is
  ``<directory>/ca.pem``, the file a verifier trusts for these URLs (the gateway's
  ``jwks_ca_file``);
* ``aud`` ``AUDIENCE`` (``svc-gateway``).

``mint`` signs with pyjwt (RFC 7519) in the two shapes of docs/architecture.md#agent-tokens:
token exchange (RFC 8693: ``sub`` the person, ``act.sub`` the agent) and client credentials
(RFC 6749 section 4.4: ``sub`` the agent), with ``svc_human_present`` and ``svc_work_item_id``
when given. ``trusted_apps`` gives the records an admin would enter (``name``, ``iss``,
``jwks_url``, ``aud``; docs/context.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from svc.common.auth import es256_public_jwk, write_secret
from svc.common.net import tcp_listener
from svc.demo.company import SERVICE_ACCOUNTS

__all__ = ["APPS", "AUDIENCE", "DevTokenIssuer", "app_of"]

log = logging.getLogger("svc.demo")

#: The ``aud`` every demo app's tokens carry (the gateway's audience).
AUDIENCE = "svc-gateway"

#: The demo apps: the prefixes of the demo company's AI agents, in their order.
APPS: tuple[str, ...] = tuple(
    dict.fromkeys(i.split(".", 1)[0] for i, ai, *_ in SERVICE_ACCOUNTS if ai)
)

#: Lifetime of a minted token unless told otherwise, in seconds.
TOKEN_LIFETIME_SECS = 3600

#: Lifetime of the CA and the server certificate, in days.
CERT_DAYS = 825


def app_of(agent: str) -> str:
    """The app that signs for a service account: its id up to the first dot.

    Raises:
        ValueError: the id has no dot (docs/architecture.md#trusted-app-issuers).

    """
    app, dot, name = agent.partition(".")
    if not dot or not app or not name:
        raise ValueError(f"agent {agent!r}: a service account id is <app>.<name>")
    return app


def _load_or_make_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The P-256 key in `path`, made (mode 0600) when missing.

    Raises:
        ValueError: the file holds another kind of key.
        OSError: the file cannot be written or read.

    """
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        write_secret(path, pem.decode("ascii"))
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey) or not isinstance(
        loaded.curve, ec.SECP256R1
    ):
        raise ValueError(f"{path} is not a P-256 private key")
    return loaded


def _certificates(directory: Path, host: str) -> tuple[Path, Path]:
    """Makes a CA and a server certificate for `host` signed by it; returns their paths.

    In `directory`: ``ca.pem`` (the CA's certificate), ``server.pem`` and ``server-key.pem``
    (mode 0600); returns (``server.pem``, ``server-key.pem``).

    Made anew at each start: only ``ca.pem`` is read by others, after the start.
    """
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svc demo token issuer CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.pem"
    tmp = ca_path.with_suffix(".tmp")
    tmp.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, ca_path)
    cert_path = directory / "server.pem"
    cert_path.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_path = directory / "server-key.pem"
    write_secret(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii"),
    )
    return cert_path, key_path


class DevTokenIssuer:
    """The demo apps' keys, their JWKS over HTTPS, and tokens signed with them (module docs).

    Args:
        directory: where the keys and certificates live (``<data_dir>/token-issuer``); created
            (mode 0700) when missing.
        host: a loopback address to bind and to name in ``iss`` (``127.0.0.1``).
        port: the HTTPS port; 0 takes a free one at ``start``.
        apps: the app names to play (``APPS``).
        audience: the ``aud`` of every token (``AUDIENCE``).

    Minting needs only the keys, so a second process (``svc demo token``) may build a
    ``DevTokenIssuer`` on the same directory and port without starting it
    (``from_directory`` reads them from ``apps.json``, which ``start`` writes).

    Raises:
        OSError: the directory or a key cannot be made or read (here), or the port cannot be
            bound (``start``).
        ValueError: a key file holds another kind of key.

    """

    def __init__(
        self,
        directory: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        apps: Sequence[str] = APPS,
        audience: str = AUDIENCE,
    ) -> None:
        self.directory = directory
        self.host = host
        self.port = port
        self.audience = audience
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)
        self._keys = {a: _load_or_make_key(directory / f"{a}.pem") for a in apps}
        self._jwks = {a: es256_public_jwk(k) for a, k in self._keys.items()}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_directory(cls, directory: Path) -> DevTokenIssuer:
        """The issuer a started one left in `directory`: its apps, address and audience.

        Reads ``<directory>/apps.json`` (``trusted_apps()``, written by ``start``), so tokens
        minted here carry the ``iss`` the running issuer serves keys for.

        Raises:
            OSError: no ``apps.json`` (the issuer never started there) or a key cannot be read.
            ValueError: ``apps.json`` is not what ``start`` writes.

        """
        records = json.loads((directory / "apps.json").read_text(encoding="utf-8"))
        if not isinstance(records, list) or not records:
            raise ValueError(f"{directory / 'apps.json'}: expected a list of trusted apps")
        base = str(records[0]["iss"]).rsplit("/", 1)[0]
        url = urllib.parse.urlsplit(base)
        if url.scheme != "https" or url.hostname is None or url.port is None:
            raise ValueError(f"{directory / 'apps.json'}: iss {base!r} is not https://host:port")
        return cls(
            directory,
            url.hostname,
            url.port,
            apps=[str(a["name"]) for a in records],
            audience=str(records[0]["aud"]),
        )

    @property
    def apps(self) -> list[str]:
        """The app names played, in order."""
        return list(self._keys)

    @property
    def base_url(self) -> str:
        """``https://<host>:<port>``."""
        return f"https://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The CA certificate that the JWKS server's certificate chains to (after ``start``)."""
        return self.directory / "ca.pem"

    def issuer(self, app: str) -> str:
        """The ``iss`` of `app`'s tokens: ``https://<host>:<port>/<app>``."""
        return f"{self.base_url}/{app}"

    def jwks_url(self, app: str) -> str:
        """Where `app`'s JWK Set is served: ``https://<host>:<port>/<app>/jwks.json``."""
        return f"{self.issuer(app)}/jwks.json"

    def jwks(self, app: str) -> dict[str, Any]:
        """`app`'s JWK Set (RFC 7517): its one ES256 public key. KeyError for another app."""
        return {"keys": [self._jwks[app]]}

    def trusted_apps(self) -> list[dict[str, str]]:
        """One trusted-app record per app: ``name``, ``iss``, ``jwks_url``, ``aud``.

        The shape of ``POST /v1/directory/trusted-apps`` (docs/context.md).
        """
        return [
            {
                "name": a,
                "iss": self.issuer(a),
                "jwks_url": self.jwks_url(a),
                "aud": self.audience,
            }
            for a in self._keys
        ]

    def mint(
        self,
        agent: str,
        person: str | None = None,
        *,
        human_present: bool | None = None,
        work_item_id: str | None = None,
        lifetime_secs: int = TOKEN_LIFETIME_SECS,
        app: str | None = None,
        now: float | None = None,
    ) -> str:
        """An agent token signed by the agent's app (ES256, header ``kid``).

        Args:
            agent: the service account id (``copilot.assistant``).
            person: the user name the agent works for: a token-exchange result (RFC 8693,
                ``sub`` the person, ``act: {"sub": agent}``); None: a client-credentials token
                (``sub`` the agent).
            human_present: ``svc_human_present`` when given.
            work_item_id: ``svc_work_item_id`` when given (``<tracker>:<key>``).
            lifetime_secs: ``exp`` - ``iat``, in seconds (negative makes an expired token).
            app: sign as this app instead of the agent's own (to show that a verifier refuses
                an app signing for another app's service account).
            now: ``iat`` as a Unix time (default the clock).

        Returns:
            The compact JWS (RFC 7515).

        Raises:
            ValueError: the agent id has no ``<app>.`` prefix, or the app is not played here.

        """
        signer = app if app is not None else app_of(agent)
        if signer not in self._keys:
            raise ValueError(f"app {signer!r} is not one of the demo apps {self.apps}")
        iat = int(now if now is not None else time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer(signer),
            "aud": self.audience,
            "iat": iat,
            "exp": iat + lifetime_secs,
            "jti": str(uuid.uuid4()),
        }
        if person is None:
            claims["sub"] = agent
        else:
            claims["sub"] = person
            claims["act"] = {"sub": agent}
        if human_present is not None:
            claims["svc_human_present"] = human_present
        if work_item_id is not None:
            claims["svc_work_item_id"] = work_item_id
        return jwt.encode(
            claims,
            self._keys[signer],
            algorithm="ES256",
            headers={"kid": self._jwks[signer]["kid"]},
        )

    # -- serving

    def start(self) -> DevTokenIssuer:
        """Serves the JWK Sets over HTTPS in a daemon thread; returns self once it listens.

        Makes the certificates first; ``port`` then holds the bound port.

        Serves ``GET /<app>/jwks.json`` (``application/json``) and ``GET /readyz``; anything
        else is 404.

        Raises:
            OSError: the port cannot be bound or the certificates written.

        """
        cert, key = _certificates(self.directory, self.host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key)
        bodies = {f"/{a}/jwks.json": json.dumps(self.jwks(a)).encode() for a in self._keys}
        bodies["/readyz"] = b'{"status": "ready"}'

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = bodies.get(self.path.split("?", 1)[0])
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.send_header("cache-control", "max-age=60")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("token issuer: " + format, *args)

        sock = tcp_listener(self.host, self.port)
        try:
            server = ThreadingHTTPServer((self.host, 0), Handler, bind_and_activate=False)
            server.socket.close()
            server.socket = ctx.wrap_socket(sock, server_side=True)
            server.daemon_threads = True
            server.server_activate()
        except BaseException:
            sock.close()
            raise
        self.port = int(server.socket.getsockname()[1])
        self._server = server
        apps = self.directory / "apps.json"
        tmp = apps.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.trusted_apps(), indent=2), encoding="utf-8")
        os.replace(tmp, apps)
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.2,), name="svc-dev-token-issuer", daemon=True
        )
        self._thread.start()
        log.info("development agent-token issuer at %s", self.base_url)
        return self

    def stop(self) -> None:
        """Stops serving and closes the socket (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m svc.demo.token_issuer --directory DIR [--host H] [--port N]``.

    Serves the demo apps' JWK Sets over HTTPS until SIGTERM or Ctrl-C (``svc topology``'s
    issuer of agent tokens; demo only). Returns the exit code (0).
    """
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="python -m svc.demo.token_issuer", description=__doc__)
    p.add_argument("--directory", type=Path, required=True, help="keys, CA and apps.json")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind and name")
    p.add_argument("--port", type=int, default=0, help="HTTPS port (0: a free one)")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    issuer = DevTokenIssuer(args.directory, args.host, args.port).start()
    try:
        stop.wait()
    finally:
        issuer.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
