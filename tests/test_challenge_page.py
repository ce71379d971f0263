"""The challenge page (docs/challenges.md#the-page) in a real browser.

A real challenge service on PostgreSQL serving its page, a real local OpenID Connect provider
(oidc-provider-mock in a thread), `svc pdp --challenge URL` as a real process opening the
challenges (as tests/test_challenge_pdp.py starts it), and headless Chromium (Debian's
`chromium`, driven by Playwright) with Chrome's virtual authenticator (CDP `WebAuthn` domain:
ctap2, internal, user verification). The links come from the notifications the service wrote
to its outbox.

Each step's screenshot (docs/challenges.md shows them) is taken into a temporary directory and
compared with the committed docs/images/challenge-*.png: the same size, and few pixels that
differ past the tolerance of a font's anti-aliasing (Pillow). A page that changed fails, naming
the image, this run's screenshot and a picture of the differences;
`make screenshots` (``SVC_REFRESH_SCREENSHOTS=1``) refreshes docs/images/ instead.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image, ImageChops
from playwright.sync_api import Browser, BrowserContext, Page, Response, sync_playwright
from sqlmodel import Session, col, select

from svc.challenge.app import ChallengeServer
from svc.challenge.dev_idp import DevIdentityProvider
from svc.challenge.directory import StaticDirectory
from svc.challenge.links import LinkRefused, LinkTokens
from svc.challenge.models import LinkUseRow, OutboxRow
from svc.challenge.service import ChallengeService
from svc.challenge.settings import ChallengeSettings
from svc.common.net import tcp_listener
from test_context import database_url
from test_pdp_standalone import Pdp

__all__ = ["database_url"]  # the fixture, used by name

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
CHROMIUM = "/usr/bin/chromium"

#: ``make screenshots`` sets it: the screenshots replace docs/images/ instead of being compared.
REFRESH = os.environ.get("SVC_REFRESH_SCREENSHOTS") == "1"
#: A pixel differs when one of its channels differs by more than this (0-255): text
#: anti-aliasing and hinting move edges by a few levels between builds of Chromium.
CHANNEL_TOLERANCE = 64
#: The share of differing pixels allowed (0-1), for the values that change on every run: the
#: key page's key id and registration time move its table's columns (about 0.7% of the
#: pixels); the other pages differ by 0.1% at most from run to run.
MAX_DIFFERING = 0.02
#: Where this run's screenshots go (set per module by ``screenshots_dir``).
SHOTS: Path | None = None

SCHEMA = """
entity Human;
entity Document;
action read, delete, share, purge appliesTo { principal: [Human], resource: [Document] };
"""

POLICIES = """
@id("delete-needs-reason") @challenge("justification")
permit (principal is Human, action == Action::"delete", resource is Document);

@id("share-needs-approval") @challenge("approval")
permit (principal is Human, action == Action::"share", resource is Document);

@id("purge-needs-a-key") @challenge("verification")
permit (principal is Human, action == Action::"purge", resource is Document);
"""


def free_port() -> int:
    s = tcp_listener("127.0.0.1", 0)
    try:
        return int(s.getsockname()[1])
    finally:
        s.close()


class World:
    """The service with its page, the identity provider, a decision point and a browser."""

    def __init__(self, database_url: str, tmp: Path, browser: Browser) -> None:
        self.idp = DevIdentityProvider(users=["ana", "bo", "cy"]).start()
        port = free_port()
        self.base = f"http://localhost:{port}"
        secret = tmp / "client-secret"
        secret.write_text("page-secret\n")
        settings = ChallengeSettings(
            database_url=database_url,
            host="127.0.0.1",
            port=port,
            rp_id="localhost",
            origins=[self.base],
            page_url=f"{self.base}/challenge",
            oidc_issuer=self.idp.issuer,
            oidc_client_secret_file=str(secret),
            link_key_file=str(tmp / "link.key"),
            heartbeat_secs=0.5,
            watch_poll_secs=0.2,
        )
        self.service = ChallengeService(
            settings, directory=StaticDirectory(managers={"ana": "bo", "bo": "cy"})
        )
        self.server = ChallengeServer(settings, self.service, outbox=False).start()
        bundle = tmp / "bundle"
        bundle.mkdir()
        (bundle / "schema.cedarschema").write_text(SCHEMA)
        (bundle / "policies.cedar").write_text(POLICIES)
        self.pdp = Pdp(
            "--bundle", str(bundle), "--port", "0", "--no-watch",
            "--challenge", self.server.url, "--challenge-timeout-ms", "30000",
        )  # fmt: skip
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.pdp.port()}", timeout=60)
        self.browser = browser
        self.contexts: list[BrowserContext] = []

    def close(self) -> None:
        for c in self.contexts:
            c.close()
        code = self.pdp.stop()
        self.http.close()
        self.server.stop()
        self.service.close()
        self.idp.stop()
        assert code == 0, self.pdp.log

    def check(self, who: str, action: str, resource: str) -> dict[str, Any]:
        body = {
            "principal": {"type": "Human", "id": who},
            "action": action,
            "resource": {"type": "Document", "id": resource},
        }
        r = self.http.post("/v1/access/evaluation", json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def challenge(self, who: str, action: str, resource: str) -> str:
        """Checks a request the bundle steps up; returns the challenge's qid."""
        out = self.check(who, action, resource)
        assert out["verdict"] == "challenge", out
        return str(out["challenge_qid"])

    def link(self, qid: str, event: str = "opened") -> str:
        """The page link of the challenge's latest ``event`` notification, from the outbox."""
        with Session(self.service.db) as s:
            rows = s.exec(
                select(OutboxRow)
                .where(OutboxRow.challenge_qid == qid, OutboxRow.event == event)
                .order_by(col(OutboxRow.id).desc())
            ).all()
        assert rows, f"no {event} notification for {qid}"
        m = re.search(r"<(http[^|>]+)\|", rows[0].payload["text"])
        assert m, rows[0].payload
        assert m.group(1).startswith(f"{self.base}/challenge/{qid}?t=")
        return m.group(1)

    def person(self) -> tuple[BrowserContext, Page]:
        """A browser of its own (cookies, virtual authenticator) for one person."""
        context = self.browser.new_context(viewport={"width": 900, "height": 600})
        # Generous waits: the machine may be busy; no step is timed.
        context.set_default_timeout(120_000)
        self.contexts.append(context)
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("WebAuthn.enable")
        cdp.send(
            "WebAuthn.addVirtualAuthenticator",
            {
                "options": {
                    "protocol": "ctap2",
                    "transport": "internal",
                    "hasResidentKey": True,
                    "hasUserVerification": True,
                    "isUserVerified": True,
                }
            },
        )
        return context, page


def compare(committed: Path, taken: Path) -> str | None:
    """How the screenshot `taken` differs from the `committed` one, or None when it matches.

    Matching: the same size, and at most ``MAX_DIFFERING`` of the pixels with a channel
    differing by more than ``CHANNEL_TOLERANCE``. A picture of the differences is saved beside
    `taken` (``*.diff.png``) when they are too many.
    """
    if not committed.is_file():
        return "there is no committed image"
    with Image.open(committed) as a, Image.open(taken) as b:
        if a.size != b.size:
            return f"the page changed shape: {b.size[0]}x{b.size[1]}, committed {a.size[0]}x{a.size[1]}"
        diff = ImageChops.difference(a.convert("RGB"), b.convert("RGB"))
    r, g, bl = diff.split()
    largest = ImageChops.lighter(ImageChops.lighter(r, g), bl)
    differing = sum(largest.histogram()[CHANNEL_TOLERANCE + 1 :])
    share = differing / (largest.size[0] * largest.size[1])
    if share <= MAX_DIFFERING:
        return None
    largest.point(lambda v: 255 if v > CHANNEL_TOLERANCE else 0).save(
        taken.with_suffix(".diff.png")
    )
    return f"{share:.1%} of the pixels differ (at most {MAX_DIFFERING:.0%} may)"


@pytest.fixture(scope="module", autouse=True)
def screenshots_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This module's screenshots go to a temporary directory (``SHOTS``)."""
    global SHOTS
    SHOTS = tmp_path_factory.mktemp("screenshots")
    yield
    SHOTS = None


def shot(page: Page, name: str) -> None:
    """Takes the step's screenshot and compares it with docs/images/challenge-`name`.png.

    Fails the test when they differ (``compare``); under ``make screenshots`` the committed
    image is replaced instead.
    """
    file = f"challenge-{name}.png"
    if REFRESH:
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / file))
        return
    assert SHOTS is not None
    taken = SHOTS / file
    page.screenshot(path=str(taken))
    problem = compare(IMAGES / file, taken)
    if problem:
        diff = taken.with_suffix(".diff.png")
        pytest.fail(
            f"docs/images/{file}: {problem}; this run's screenshot is {taken}"
            + (f" (the differing pixels in {diff})" if diff.exists() else "")
            + ". If the page changed on purpose, run `make screenshots` to refresh "
            "docs/images/, and commit the images.",
            pytrace=False,
        )


def sign_in(page: Page, user: str, screenshot: str | None = None) -> Response:
    """Signs in on the provider's form (shown after a redirect from the page).

    Returns the answer of the page the sign-in leads back to (after the callback's redirect).
    """
    page.wait_for_selector("input[name=sub]")
    page.fill("input[name=sub]", user)
    if screenshot:
        shot(page, screenshot)
    with page.expect_response(
        lambda r: (
            r.request.method == "GET"
            and r.url.startswith(("http://localhost", "http://127.0.0.1"))
            and "/auth/" not in r.url
            and r.request.resource_type == "document"
            and r.status != 303
            and "/oauth2/" not in r.url
        )
    ) as info:
        page.click("button[type=submit]:has-text('Authorize')")
    return info.value


def state_is(page: Page, state: str) -> None:
    page.wait_for_selector(f"#state.{state}")


def refused(response: Response | None) -> str:
    assert response is not None and response.status == 403, response and response.status
    body = response.json()
    assert body["status"] == 403
    return str(body["detail"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture
def world(database_url: str, tmp_path: Path, browser: Browser) -> Iterator[World]:
    w = World(database_url, tmp_path, browser)
    yield w
    w.close()


def test_verification_from_the_link_to_the_retry_being_allowed(world: World) -> None:
    qid = world.challenge("ana", "purge", "d1")
    link = world.link(qid)
    _, page = world.person()
    page.goto(link)
    sign_in(page, "ana", "signin")
    page.wait_for_selector("#verify:not(.hidden)")
    page.wait_for_selector("#no-key:not(.hidden)")
    assert page.text_content("#action") == "purge"
    assert page.text_content("#resource") == 'Document::"d1"'
    assert page.text_content("#who") == 'Human::"ana"'
    assert "verification" in (page.text_content("#why") or "")
    assert "?t=" not in page.url  # the token left the address bar
    shot(page, "open")
    # No key yet: register one on the key page, then come back.
    page.click("#register-link")
    page.wait_for_selector("#register-button")
    page.fill("#key-name", "laptop key")
    page.click("#register-button")
    page.wait_for_selector("#keys tr")
    assert "laptop key" in (page.text_content("#keys") or "")
    shot(page, "keys")
    page.click("#back")
    page.wait_for_selector("#verify-button:not([disabled])")
    page.click("#verify-button")
    state_is(page, "passed")
    assert "verification" in (page.text_content("#satisfied") or "")
    shot(page, "passed")
    # The agent's retry of that exact request is allowed.
    out = world.check("ana", "purge", "d1")
    assert out["verdict"] == "allow" and "svc:challenge_passed" in out["policies"], out
    # The key page changes the key (the old one proves it) and removes it.
    (old,) = world.service.list_security_keys("ana")
    page.goto(f"{world.base}/keys")
    page.wait_for_selector("#keys tr")
    page.fill("#key-name", "new key")
    page.click("#keys tr button.change")
    page.wait_for_selector("#status:has-text('Key changed.')")
    (new,) = world.service.list_security_keys("ana")
    assert new.credential_id != old.credential_id and new.name == "new key"
    page.click("#keys tr button.remove")
    page.wait_for_selector("#no-keys:not(.hidden)")
    assert world.service.list_security_keys("ana") == []


def test_justification_and_a_reused_or_tampered_link(world: World) -> None:
    qid = world.challenge("ana", "delete", "d2")
    link = world.link(qid)
    _, page = world.person()
    page.goto(link)
    sign_in(page, "ana")
    page.wait_for_selector("#justify:not(.hidden)")
    page.fill("#justify-text", "cleaning up the drafts of last year")
    shot(page, "justify")
    page.click("#justify-button")
    state_is(page, "passed")
    assert world.check("ana", "delete", "d2")["verdict"] == "allow"
    # The same link in another browser, signed in as ana again: used already.
    _, again = world.person()
    again.goto(link)
    assert "used already" in refused(sign_in(again, "ana"))
    shot(again, "refused")
    # A tampered link is refused before anybody signs in.
    _, other = world.person()
    head, token = link.split("?t=")
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert "does not verify" in refused(other.goto(f"{head}?t={tampered}"))
    # ... and a link of another challenge, or none at all, opens nothing.
    other_qid = world.challenge("ana", "delete", "d3")
    assert "another challenge" in refused(
        other.goto(f"{world.base}/challenge/{other_qid}?t={token}")
    )
    assert "from the link" in refused(other.goto(f"{world.base}/challenge/{qid}"))
    with Session(world.service.db) as s:
        assert len(s.exec(select(LinkUseRow)).all()) == 1


def test_a_forwarded_link_lets_no_one_else_answer(world: World) -> None:
    qid = world.challenge("ana", "purge", "d4")
    link = world.link(qid)
    _, bo = world.person()
    bo.goto(link)
    assert "for `ana`, not `bo`" in refused(sign_in(bo, "bo"))
    # bo's own API calls cannot reach it either.
    r = bo.request.get(f"{world.base}/page/api/challenges/{qid}")
    assert r.status == 403
    # The link was not spent: ana still opens it.
    _, ana = world.person()
    ana.goto(link)
    sign_in(ana, "ana")
    ana.wait_for_selector("#verify:not(.hidden)")
    # A POST without the session's CSRF token is refused.
    r = ana.request.post(f"{world.base}/page/api/challenges/{qid}/verification/begin", data={})
    assert r.status == 403 and "CSRF" in r.json()["detail"]


def test_approval_and_rejection_by_the_approver(world: World) -> None:
    passed = world.challenge("ana", "share", "d5")
    rejected = world.challenge("ana", "share", "d6")
    _, bo = world.person()
    bo.goto(world.link(passed))
    sign_in(bo, "bo", None)
    bo.wait_for_selector("#decide:not(.hidden)")
    assert bo.is_hidden("#verify") and bo.is_hidden("#justify")
    bo.fill("#decide-reason", "fine for the audit")
    shot(bo, "approve")
    bo.click("#approve-button")
    state_is(bo, "passed")
    assert world.check("ana", "share", "d5")["verdict"] == "allow"
    bo.goto(world.link(rejected))
    bo.wait_for_selector("#decide:not(.hidden)")
    bo.fill("#decide-reason", "not this one")
    bo.click("#reject-button")
    state_is(bo, "rejected")
    shot(bo, "rejected")
    out = world.check("ana", "share", "d6")
    assert out["verdict"] == "deny" and "svc:challenge_rejected" in out["policies"], out
    # ana, the person, cannot open the approver's link, nor approve.
    _, ana = world.person()
    ana.goto(world.link(passed))
    assert "not `ana`" in refused(sign_in(ana, "ana"))


def test_link_tokens_expire_and_bind_their_challenge(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "link.key"
    tokens = LinkTokens.from_file(str(key_file), 60)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # The same file gives the same key: another replica verifies the token.
    other = LinkTokens.from_file(str(key_file), 60)
    now = datetime.now(UTC)
    token = tokens.mint("q1", "ana", "opened", now)
    claims = other.verify(token, "q1")
    assert (claims.qid, claims.recipient, claims.event) == ("q1", "ana", "opened")
    assert claims.jti and claims.expires_at > now
    with pytest.raises(LinkRefused, match="another challenge"):
        tokens.verify(token, "q2")
    with pytest.raises(LinkRefused, match="expired"):
        tokens.verify(tokens.mint("q1", "ana", "opened", now - timedelta(seconds=120)), "q1")
    with pytest.raises(LinkRefused):
        LinkTokens.from_file(None, 60).verify(token, "q1")  # another key
    with pytest.raises(ValueError):
        LinkTokens(b"short", 60)


def test_screenshots_are_compared_by_size_and_a_share_of_differing_pixels(
    tmp_path: Path,
) -> None:
    """``compare``: what passes (anti-aliasing, a few changed values) and what fails."""
    committed = IMAGES / "challenge-open.png"
    with Image.open(committed) as img:
        page = img.convert("RGB")
    width, height = page.size

    def taken(name: str, image: Image.Image) -> Path:
        path = tmp_path / name
        image.save(path)
        return path

    assert compare(committed, taken("same.png", page)) is None
    # Every pixel a little off (another build's anti-aliasing): the same page.
    lighter = page.point(lambda v: min(255, v + CHANNEL_TOLERANCE // 2))
    assert compare(committed, taken("lighter.png", lighter)) is None
    # A small box of changed values (a time, an id): within the share allowed.
    small = page.copy()
    small.paste((255, 0, 255), (0, 0, width // 20, height // 20))
    assert compare(committed, taken("small.png", small)) is None
    # A band of the page changed: fails, and the differences are saved.
    band = page.copy()
    band.paste((255, 0, 255), (0, height // 3, width, height // 3 + height // 10))
    problem = compare(committed, taken("band.png", band))
    assert problem is not None and "of the pixels differ" in problem
    assert (tmp_path / "band.diff.png").is_file()
    # Another size: the page changed shape.
    taller = Image.new("RGB", (width, height + 40), "white")
    taller.paste(page, (0, 0))
    problem = compare(committed, taken("taller.png", taller))
    assert problem is not None and "changed shape" in problem
    assert compare(tmp_path / "missing.png", committed) == "there is no committed image"
