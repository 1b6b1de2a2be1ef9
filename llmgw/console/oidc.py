"""Logging in to the console through an OpenID Connect provider: the authorization code flow with PKCE (RFC 7636,
S256), a `state` and a `nonce` per login, the ID token checked with joserfc (RFC 7519 and OpenID Connect Core 1.0
section 3.1.3.7): signature by a key of the provider's JWKS (RS256 or ES256; `none` and HMAC refused), `iss` the
issuer, `aud` holding our client id (and `azp` ours when there are several), `exp`/`iat` in force, `nonce` the
login's. The e-mail claim names the person (from the ID token, else from the userinfo endpoint for the same `sub`);
what they may do follows projects.yaml, as for a password login.

    client = OidcClient(OidcSettings(issuer, client_id, client_secret, redirect_uri))
    url = await client.begin(now)             # redirect the browser there
    email = await client.finish(code, state, now)   # on the callback: the verified e-mail, or OidcError

`check_id_token` is pure (the tests feed it tampered tokens); `OidcClient` keeps the logins in progress in memory
(at most PENDING_MAX, each for PENDING_SECONDS) and talks to the provider with httpx (timeouts of HTTP_TIMEOUT s).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from llmgw.errors import UsageError

PENDING_SECONDS = 600.0
PENDING_MAX = 1000
HTTP_TIMEOUT = 10.0
ALGORITHMS = ("RS256", "ES256")


class OidcError(UsageError):
    """A login through the provider that is refused: the sentence says why (no token or secret in it)."""


@dataclass(frozen=True)
class OidcSettings:
    """The provider (`issuer`, its URL as it names itself) and this console as its client: `client_id`,
    `client_secret` (sent in the token request's body) and `redirect_uri` (…/console/oidc/callback)."""

    issuer: str
    client_id: str
    client_secret: str
    redirect_uri: str


@dataclass(frozen=True)
class _Pending:
    nonce: str
    verifier: str
    expires: float


def pkce_challenge(verifier: str) -> str:
    """The S256 code challenge of `verifier` (RFC 7636 section 4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def check_id_token(id_token: str, keys: KeySet, issuer: str, client_id: str, nonce: str, now: float,
                   leeway: int = 60) -> dict[str, Any]:
    """The claims of `id_token` once every check of the module docstring passes at `now` (unix seconds, `leeway`
    seconds of clock skew allowed). Raises OidcError naming the failed check."""
    try:
        token = jwt.decode(id_token, keys, algorithms=list(ALGORITHMS))
    except (JoseError, ValueError) as exc:
        raise OidcError(f"the provider's ID token does not verify ({type(exc).__name__}): log in again") from None
    claims = token.claims
    registry = jwt.JWTClaimsRegistry(now=int(now), leeway=leeway, iss={"essential": True, "value": issuer},
                                     exp={"essential": True}, iat={"essential": True}, sub={"essential": True})
    try:
        registry.validate(claims)
    except JoseError as exc:
        raise OidcError(f"the ID token's claims are refused ({exc.error}: {exc.description or 'iss, exp or iat'})"
                        ) from None
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else list(audience or [])
    if client_id not in audiences or (len(audiences) > 1 and claims.get("azp") != client_id):
        raise OidcError(f"the ID token is for {', '.join(map(str, audiences)) or 'no audience'}, not this console "
                        f"({client_id})")
    if not nonce or not secrets.compare_digest(str(claims.get("nonce", "")), nonce):
        raise OidcError("the ID token's nonce is not this login's: log in again")
    return dict(claims)


class OidcClient:
    """One provider's logins in progress and its metadata (fetched once, on the first login)."""

    def __init__(self, settings: OidcSettings, transport: httpx.AsyncBaseTransport | None = None):
        self.settings = settings
        self.transport = transport
        self._pending: dict[str, _Pending] = {}
        self._metadata: dict[str, Any] | None = None

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=HTTP_TIMEOUT, transport=self.transport)

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document (`/.well-known/openid-configuration`), checked to name our issuer.
        A checkpoint. Raises OidcError when it cannot be read or names another issuer."""
        if self._metadata is None:
            url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            try:
                async with self._client() as client:
                    answer = await client.get(url)
                document = answer.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise OidcError(f"the OpenID provider's discovery document at {url} cannot be read ({exc})") from None
            if document.get("issuer") != self.settings.issuer:
                raise OidcError(f"the OpenID provider at {url} names itself {document.get('issuer')!r}, not "
                                f"{self.settings.issuer!r}")
            self._metadata = document
        return self._metadata

    async def begin(self, now: float) -> str:
        """The provider's authorization URL for a new login (state, nonce and a PKCE S256 challenge of a fresh
        verifier, kept for PENDING_SECONDS). A checkpoint."""
        metadata = await self.metadata()
        self._pending = {k: p for k, p in self._pending.items() if p.expires > now}
        while len(self._pending) >= PENDING_MAX:
            self._pending.pop(next(iter(self._pending)))
        state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
        self._pending[state] = _Pending(nonce, verifier, now + PENDING_SECONDS)
        query = {"response_type": "code", "client_id": self.settings.client_id, "scope": "openid email",
                 "redirect_uri": self.settings.redirect_uri, "state": state, "nonce": nonce,
                 "code_challenge": pkce_challenge(verifier), "code_challenge_method": "S256"}
        return f"{metadata['authorization_endpoint']}?{urlencode(query)}"

    async def finish(self, code: str, state: str, now: float) -> str:
        """The verified e-mail of the login `state` whose provider answered `code`. A checkpoint. Raises OidcError
        for an unknown or expired state, a refused code exchange, an ID token that fails `check_id_token`, or no
        verified e-mail claim."""
        pending = self._pending.pop(state, None)
        if pending is None or pending.expires <= now:
            raise OidcError("this login through the OpenID provider is unknown or too old: start again")
        metadata = await self.metadata()
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.settings.redirect_uri,
                "client_id": self.settings.client_id, "client_secret": self.settings.client_secret,
                "code_verifier": pending.verifier}
        try:
            async with self._client() as client:
                answer = await client.post(metadata["token_endpoint"], data=form)
                tokens = answer.json()
                if answer.status_code != 200 or "id_token" not in tokens:
                    raise OidcError(f"the OpenID provider refused the login's code: {tokens.get('error', answer.status_code)}"
                                    f" {tokens.get('error_description', '')}".rstrip())
                keys = KeySet.import_key_set((await client.get(metadata["jwks_uri"])).json())
                claims = check_id_token(tokens["id_token"], keys, self.settings.issuer, self.settings.client_id,
                                        pending.nonce, now)
                if not claims.get("email") and tokens.get("access_token") and metadata.get("userinfo_endpoint"):
                    # a provider may keep the e-mail out of the ID token (OpenID Connect Core 5.4): its userinfo
                    # answer counts only for the same subject (5.3.2)
                    info = (await client.get(metadata["userinfo_endpoint"],
                                             headers={"Authorization": f"Bearer {tokens['access_token']}"})).json()
                    if info.get("sub") == claims.get("sub"):
                        claims = {**claims, "email": info.get("email"), "email_verified": info.get("email_verified")}
        except (httpx.HTTPError, ValueError) as exc:
            raise OidcError(f"the OpenID provider cannot be reached or answered nonsense ({exc})") from None
        email = str(claims.get("email") or "")
        if not email or claims.get("email_verified") is False:
            raise OidcError("the OpenID provider gave no verified e-mail for this login: ask for the `email` scope")
        return email.strip().lower()
