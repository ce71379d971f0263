//! Who may call the decision point: bearer-token authentication in front of every route
//! (docs/auth.md).
//!
//! Every HTTP and gRPC request other than the probes (`/healthz`, `/readyz`, `/version`,
//! `/metrics`, AuthZEN's discovery document and gRPC health) must carry
//! `Authorization: Bearer <JWT>` (RFC 6750 section 2.1; gRPC callers send it as the
//! `authorization` metadata entry, which is the same HTTP/2 header). The token must be a JWT
//! (RFC 7519) signed with RS256 or ES256 by a key of the configured issuer's JWKS (RFC 7517),
//! with `iss` the issuer, `aud` naming this component, `exp` in the future and a `sub` listed
//! among the allowed callers.
//!
//! Refusals: HTTP callers get a 401 problem (RFC 9457) with `WWW-Authenticate: Bearer` (RFC 6750
//! section 3: `error="invalid_token"` when a token was sent) for a missing or invalid token,
//! and a 403 problem for a valid token whose `sub` is not listed; gRPC callers get
//! `UNAUTHENTICATED` or `PERMISSION_DENIED` (a trailers-only response) with the same text.
//! Tokens are never logged or echoed.
//!
//! The JWKS is loaded by Python's control plane (`svc.pdp.server`, which reads the file or
//! fetches the URL and refreshes it for key rotation) and handed over with
//! [`Authenticator::set_jwks`]; nothing here does I/O.
//!
//! An ES256 verification costs far more than a check, so verified tokens are cached, keyed by
//! the token itself, in a bounded LRU map: an entry holds until the token's `exp` or the cache
//! TTL, whichever comes first, and every entry is dropped when the JWKS changes. A repeat caller
//! pays one hash lookup.

use crate::problem::{bounded, has_h1_body, Problem};
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// Paths served without a token: the probes every component answers (docs/api.md), AuthZEN's
/// discovery document (public metadata by the AuthZEN 1.0 specification) and gRPC health (the
/// gRPC form of `/readyz`; Kubernetes gRPC probes send no token).
pub fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/version" | "/metrics" | "/.well-known/authzen-configuration"
    ) || path.starts_with("/grpc.health.v1.Health/")
}

/// Longest `kid` quoted back in an error.
const MAX_KID_QUOTED: usize = 64;

/// The settings of [`Authenticator`] (docs/auth.md lists them as `SVC_PDP_AUTH_*`).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The only accepted `iss` (RFC 7519 section 4.1.1).
    pub issuer: String,
    /// This component's name, which `aud` must contain (`svc-pdp`).
    pub audience: String,
    /// The `sub` values allowed to call; a verified token with another `sub` gets 403.
    pub callers: HashSet<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway_secs: u64,
    /// Verified tokens kept in the cache; 0 verifies every request.
    pub cache_entries: usize,
    /// Longest time a cached verification is trusted, in seconds (the token's `exp` may end it
    /// sooner).
    pub cache_ttl_secs: u64,
}

/// One key of the issuer's JWKS, usable for exactly one algorithm.
struct Key {
    alg: Algorithm,
    key: DecodingKey,
}

/// The issuer's keys as of one [`Authenticator::set_jwks`]; `generation` tells cache entries of
/// an older JWKS apart.
#[derive(Default)]
struct KeySet {
    generation: u64,
    by_kid: HashMap<String, Key>,
    without_kid: Vec<Key>,
}

impl KeySet {
    fn len(&self) -> usize {
        self.by_kid.len() + self.without_kid.len()
    }
}

/// A verified token in the cache.
#[derive(Clone)]
struct Verified {
    generation: u64,
    /// Unix seconds after which the entry is no longer trusted.
    until: u64,
    allowed: bool,
    sub: Arc<str>,
}

/// Why a request was refused; the text names what was wrong, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header: 401 without an error code (RFC 6750 section 3.1).
    Missing,
    /// A token was sent but is not acceptable: 401 `invalid_token`.
    Invalid(String),
    /// A valid token of a caller that is not listed: 403.
    Forbidden(String),
}

impl Refusal {
    /// The text of the problem's `detail` and of the gRPC status message.
    pub fn detail(&self) -> String {
        match self {
            Self::Missing => "no bearer token: send `Authorization: Bearer <JWT>` (gRPC: the `authorization` metadata entry); see docs/auth.md".to_owned(),
            Self::Invalid(d) | Self::Forbidden(d) => d.clone(),
        }
    }

    /// The refusal as the caller's protocol has it: a gRPC status for gRPC requests, an RFC
    /// 9457 problem otherwise.
    pub fn respond(&self, grpc: bool, realm: &str) -> Response {
        let detail = self.detail();
        if grpc {
            let status = match self {
                Self::Forbidden(_) => tonic::Status::permission_denied(detail),
                _ => tonic::Status::unauthenticated(detail),
            };
            return status.into_http();
        }
        match self {
            Self::Forbidden(_) => Problem::new(
                StatusCode::FORBIDDEN,
                "caller-not-allowed",
                "The caller is not allowed",
                detail,
            )
            .into_response(),
            _ => {
                let mut resp = Problem::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "Authentication required",
                    detail,
                )
                .into_response();
                let challenge = match self {
                    Self::Missing => format!("Bearer realm=\"{realm}\""),
                    _ => format!("Bearer realm=\"{realm}\", error=\"invalid_token\""),
                };
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    resp.headers_mut().insert(WWW_AUTHENTICATE, v);
                }
                resp
            }
        }
    }
}

/// The claims read from a verified token (others are ignored).
#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
}

/// Verifies bearer tokens against the issuer's JWKS and the allowed callers; shared by every
/// request (see the module docs).
pub struct Authenticator {
    config: AuthConfig,
    rs256: Validation,
    es256: Validation,
    keys: arc_swap::ArcSwap<KeySet>,
    cache: Option<Mutex<lru::LruCache<Box<str>, Verified, foldhash::fast::RandomState>>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("config", &self.config)
            .field("keys", &self.keys.load().len())
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// The `alg` and `kid` of a token's header, read before anything is verified so that a refused
/// algorithm (`none`, `HS256`) is named as such.
fn header_fields(token: &str) -> Result<(String, Option<String>), Refusal> {
    let not_jwt = || {
        Refusal::Invalid(
            "the bearer token is not a JWT (RFC 7519: three base64url parts separated by dots)"
                .to_owned(),
        )
    };
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(not_jwt());
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head.trim_end_matches('='))
        .map_err(|_| not_jwt())?;
    let v: serde_json::Value = serde_json::from_slice(&raw).map_err(|_| not_jwt())?;
    let alg = v
        .get("alg")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| Refusal::Invalid("the token's header names no `alg`".to_owned()))?;
    let kid = v
        .get("kid")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    Ok((alg.to_owned(), kid))
}

fn quoted(kid: &str) -> String {
    let mut end = kid.len().min(MAX_KID_QUOTED);
    while !kid.is_char_boundary(end) {
        end -= 1;
    }
    kid.get(..end)
        .unwrap_or_default()
        .escape_default()
        .to_string()
}

impl Authenticator {
    /// An authenticator with no keys yet (every token is refused until [`Self::set_jwks`]).
    pub fn new(config: AuthConfig) -> Self {
        // One validation per algorithm: jsonwebtoken wants every algorithm of a validation to
        // be of the key's family, and RS256 and ES256 are not.
        let validation = |alg| {
            let mut v = Validation::new(alg);
            v.set_issuer(&[&config.issuer]);
            v.set_audience(&[&config.audience]);
            v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
            v.leeway = config.leeway_secs;
            v.validate_nbf = true;
            v
        };
        let rs256 = validation(Algorithm::RS256);
        let es256 = validation(Algorithm::ES256);
        let cache = NonZeroUsize::new(config.cache_entries).map(|n| {
            Mutex::new(lru::LruCache::with_hasher(
                n,
                foldhash::fast::RandomState::default(),
            ))
        });
        Self {
            config,
            rs256,
            es256,
            keys: arc_swap::ArcSwap::from_pointee(KeySet::default()),
            cache,
        }
    }

    /// The settings.
    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// Keys currently loaded.
    pub fn key_count(&self) -> usize {
        self.keys.load().len()
    }

    /// Replaces the issuer's keys with those of `jwks` (a JWK Set document, RFC 7517 section 5)
    /// and drops every cached verification. Keys that cannot verify RS256 or ES256 (symmetric
    /// `oct` keys, other curves, `use` other than `sig`, another `alg`) are skipped.
    ///
    /// Returns the number of keys taken.
    ///
    /// # Errors
    /// The text of the problem when `jwks` is not a JWK Set or holds no usable key; the keys
    /// in force are then kept.
    pub fn set_jwks(&self, jwks: &str) -> Result<usize, String> {
        let set: JwkSet = serde_json::from_str(jwks)
            .map_err(|e| format!("the JWKS is not a JWK Set (RFC 7517 section 5): {e}"))?;
        let mut next = KeySet {
            generation: self.keys.load().generation + 1,
            ..KeySet::default()
        };
        for jwk in &set.keys {
            if jwk
                .common
                .public_key_use
                .as_ref()
                .is_some_and(|u| *u != PublicKeyUse::Signature)
            {
                continue;
            }
            let alg = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                _ => continue,
            };
            let declared_ok = match jwk.common.key_algorithm {
                None => true,
                Some(KeyAlgorithm::RS256) => alg == Algorithm::RS256,
                Some(KeyAlgorithm::ES256) => alg == Algorithm::ES256,
                Some(_) => false,
            };
            if !declared_ok {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            let key = Key { alg, key };
            match &jwk.common.key_id {
                Some(kid) => {
                    next.by_kid.insert(kid.clone(), key);
                }
                None => next.without_kid.push(key),
            }
        }
        let n = next.len();
        if n == 0 {
            return Err(format!(
                "the JWKS holds no RS256 or ES256 (P-256) signing key ({} keys in all)",
                set.keys.len()
            ));
        }
        self.keys.store(Arc::new(next));
        if let Some(c) = &self.cache {
            c.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clear();
        }
        Ok(n)
    }

    /// Checks the `Authorization` header of a request.
    ///
    /// Returns the caller's `sub`.
    ///
    /// # Errors
    /// [`Refusal::Missing`] without a bearer token, [`Refusal::Invalid`] for a token that does
    /// not verify (malformed, algorithm other than RS256/ES256, unknown key, bad signature,
    /// expired, not yet valid, wrong issuer or audience, a required claim missing) and
    /// [`Refusal::Forbidden`] for a valid token whose `sub` is not an allowed caller.
    pub fn authenticate(&self, header: Option<&HeaderValue>) -> Result<Arc<str>, Refusal> {
        let value = header.ok_or(Refusal::Missing)?;
        let text = value.to_str().map_err(|_| {
            Refusal::Invalid("the `Authorization` header is not visible ASCII".to_owned())
        })?;
        let (scheme, token) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(Refusal::Missing);
        }
        let now = now_secs();
        let generation = self.keys.load().generation;
        if let Some(c) = &self.cache {
            let mut c = c.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match c.get(token).cloned() {
                Some(v) if v.generation == generation && now < v.until => {
                    drop(c);
                    return self.admit(v.allowed, v.sub);
                }
                Some(_) => {
                    c.pop(token);
                }
                None => {}
            }
        }
        let (claims, generation) = self.verify(token)?;
        let allowed = self.config.callers.contains(&claims.sub);
        let sub: Arc<str> = Arc::from(claims.sub);
        let until = claims
            .exp
            .min(now.saturating_add(self.config.cache_ttl_secs));
        if let Some(c) = &self.cache {
            if until > now {
                c.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .put(
                        token.into(),
                        Verified {
                            generation,
                            until,
                            allowed,
                            sub: sub.clone(),
                        },
                    );
            }
        }
        self.admit(allowed, sub)
    }

    fn admit(&self, allowed: bool, sub: Arc<str>) -> Result<Arc<str>, Refusal> {
        if allowed {
            return Ok(sub);
        }
        Err(Refusal::Forbidden(format!(
            "caller `{}` is not allowed to call {}; the allowed callers and their roles are a setting of this service (SVC_PDP_AUTH_ROLES, docs/auth.md#roles-and-methods)",
            bounded(sub.to_string()),
            self.config.audience
        )))
    }

    /// Verifies signature and claims; returns the claims and the key generation used.
    fn verify(&self, token: &str) -> Result<(Claims, u64), Refusal> {
        use jsonwebtoken::errors::ErrorKind as K;
        let (alg, kid) = header_fields(token)?;
        let alg = match alg.as_str() {
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            other => {
                return Err(Refusal::Invalid(format!(
                    "the token's algorithm `{}` is not accepted; tokens must be signed with RS256 or ES256",
                    quoted(other)
                )))
            }
        };
        let keys = self.keys.load_full();
        let candidates: Vec<&Key> = match &kid {
            Some(k) => match keys.by_kid.get(k) {
                Some(key) => vec![key],
                None => {
                    return Err(Refusal::Invalid(format!(
                        "no key with kid `{}` in the issuer's JWKS",
                        quoted(k)
                    )))
                }
            },
            None => keys.without_kid.iter().collect(),
        };
        let mut last = Refusal::Invalid(match &kid {
            Some(k) => format!(
                "the token's algorithm {alg:?} is not the one of key `{}`",
                quoted(k)
            ),
            None => format!(
                "the token names no `kid` and the issuer's JWKS has no {alg:?} key without one"
            ),
        });
        let validation = if alg == Algorithm::RS256 {
            &self.rs256
        } else {
            &self.es256
        };
        for key in candidates.into_iter().filter(|k| k.alg == alg) {
            match jsonwebtoken::decode::<Claims>(token, &key.key, validation) {
                Ok(data) => return Ok((data.claims, keys.generation)),
                Err(e) => {
                    last = Refusal::Invalid(match e.kind() {
                        K::InvalidSignature => {
                            "the token's signature does not verify with the issuer's key".to_owned()
                        }
                        K::ExpiredSignature => "the token has expired (`exp`)".to_owned(),
                        K::ImmatureSignature => "the token is not valid yet (`nbf`)".to_owned(),
                        K::InvalidIssuer => format!(
                            "the token's issuer (`iss`) is not `{}`",
                            self.config.issuer
                        ),
                        K::InvalidAudience => format!(
                            "the token's audience (`aud`) does not name `{}`",
                            self.config.audience
                        ),
                        K::MissingRequiredClaim(c) => format!(
                            "the token has no `{c}` claim (exp, iss, aud and sub are required)"
                        ),
                        K::InvalidClaimFormat(c) => {
                            format!("the token's `{c}` claim is malformed")
                        }
                        K::InvalidAlgorithm => {
                            "the token's algorithm does not match its key".to_owned()
                        }
                        K::Json(_) => "the token's claims are not a JSON object with a string `sub` and a numeric `exp`".to_owned(),
                        _ => "the bearer token does not verify".to_owned(),
                    });
                    // A signature failure may be another key without a kid; anything else is
                    // about the claims and the same for every key.
                    if !matches!(e.kind(), K::InvalidSignature | K::InvalidAlgorithm) {
                        break;
                    }
                }
            }
        }
        Err(last)
    }
}

fn is_grpc(req: &Request) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// The middleware: lets public paths through, checks the bearer token of everything else.
///
/// A refused HTTP/1 request's body is never read; hyper then closes the connection (it drains
/// only a small rest), so the refusal says `Connection: close`, as `http::around` does for the
/// other answers that leave a body unread.
async fn require(State(auth): State<Arc<Authenticator>>, req: Request, next: Next) -> Response {
    if is_public(req.uri().path()) {
        return next.run(req).await;
    }
    match auth.authenticate(req.headers().get(AUTHORIZATION)) {
        Ok(_) => next.run(req).await,
        Err(refusal) => {
            let mut resp = refusal.respond(is_grpc(&req), &auth.config.audience);
            if has_h1_body(&req) {
                resp.headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            resp
        }
    }
}

/// `app` behind the bearer-token check when `auth` is set; `app` unchanged otherwise.
pub fn guard(app: Router, auth: Option<Arc<Authenticator>>) -> Router {
    match auth {
        Some(a) => app.layer(middleware::from_fn_with_state(a, require)),
        None => app,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::panic)]
    use super::*;

    fn config() -> AuthConfig {
        AuthConfig {
            issuer: "https://issuer.example".into(),
            audience: "svc-pdp".into(),
            callers: ["app".to_owned()].into_iter().collect(),
            leeway_secs: 0,
            cache_entries: 8,
            cache_ttl_secs: 60,
        }
    }

    // A P-256 public key (RFC 7515 appendix A.3) and an RSA one (RFC 7515 appendix A.2).
    const EC: &str = r#"{"kty":"EC","crv":"P-256","kid":"ec","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}"#;
    const RSA: &str = r#"{"kty":"RSA","kid":"rsa","e":"AQAB","n":"ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPMEzP1Pt0Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-bSf63kpaSHSXndS5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3qCo5ZwKh9kG4LT6_I5IhlJH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9gb54h4FRWyuXpoQ"}"#;

    #[test]
    fn public_paths_are_the_probes_discovery_and_grpc_health() {
        for p in [
            "/healthz",
            "/readyz",
            "/version",
            "/metrics",
            "/.well-known/authzen-configuration",
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
        ] {
            assert!(is_public(p), "{p}");
        }
        for p in [
            "/v1/access/evaluation",
            "/svc.authz.v1.Authorizer/Check",
            "/svc.authz.v1.Authorizer/BatchCheck",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/healthz/x",
            "/v1/noop",
        ] {
            assert!(!is_public(p), "{p}");
        }
    }

    #[test]
    fn jwks_keeps_only_rs256_and_es256_signing_keys() {
        let a = Authenticator::new(config());
        let oct = r#"{"kty":"oct","kid":"hmac","k":"c2VjcmV0"}"#;
        let enc = EC.replace(r#""kid":"ec""#, r#""kid":"enc","use":"enc""#);
        let p384_alg = EC.replace(r#""kid":"ec""#, r#""kid":"es384","alg":"ES384""#);
        let doc = format!(r#"{{"keys":[{EC},{RSA},{oct},{enc},{p384_alg}]}}"#);
        assert_eq!(a.set_jwks(&doc), Ok(2));
        assert_eq!(a.key_count(), 2);
        let err = a
            .set_jwks(&format!(r#"{{"keys":[{oct}]}}"#))
            .expect_err("no usable key");
        assert!(err.contains("no RS256 or ES256"), "{err}");
        assert_eq!(a.key_count(), 2, "a refused JWKS keeps the keys in force");
        assert!(a.set_jwks("[]").is_err());
    }

    fn token(header: &str, claims: &str) -> String {
        let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.c2ln", b(header), b(claims))
    }

    fn bearer(t: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {t}")).expect("ascii")
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let a = Authenticator::new(config());
        a.set_jwks(&format!(r#"{{"keys":[{EC}]}}"#)).expect("jwks");
        assert_eq!(a.authenticate(None), Err(Refusal::Missing));
        let basic = HeaderValue::from_static("Basic dXNlcjpwYXNz");
        assert_eq!(a.authenticate(Some(&basic)), Err(Refusal::Missing));
        let claims =
            r#"{"iss":"https://issuer.example","aud":"svc-pdp","sub":"app","exp":99999999999}"#;
        for (header, want) in [
            (r#"{"alg":"none"}"#, "algorithm `none` is not accepted"),
            (r#"{"alg":"HS256","kid":"ec"}"#, "algorithm `HS256`"),
            (
                r#"{"alg":"ES256","kid":"other"}"#,
                "no key with kid `other`",
            ),
            (r#"{"alg":"ES256","kid":"ec"}"#, "signature does not verify"),
            (r#"{"typ":"JWT"}"#, "names no `alg`"),
        ] {
            match a.authenticate(Some(&bearer(&token(header, claims)))) {
                Err(Refusal::Invalid(d)) => assert!(d.contains(want), "{header}: {d}"),
                other => panic!("{header}: {other:?}"),
            }
        }
        match a.authenticate(Some(&bearer("not-a-jwt"))) {
            Err(Refusal::Invalid(d)) => assert!(d.contains("not a JWT"), "{d}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusal_answers_per_protocol() {
        let r = Refusal::Invalid("bad".into()).respond(false, "svc-pdp");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers().get(WWW_AUTHENTICATE).map(HeaderValue::as_bytes),
            Some(&b"Bearer realm=\"svc-pdp\", error=\"invalid_token\""[..])
        );
        let r = Refusal::Missing.respond(false, "svc-pdp");
        assert_eq!(
            r.headers().get(WWW_AUTHENTICATE).map(HeaderValue::as_bytes),
            Some(&b"Bearer realm=\"svc-pdp\""[..])
        );
        let r = Refusal::Forbidden("no".into()).respond(false, "svc-pdp");
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let g = Refusal::Forbidden("no".into()).respond(true, "svc-pdp");
        assert_eq!(g.status(), StatusCode::OK);
        assert_eq!(
            g.headers().get("grpc-status").map(HeaderValue::as_bytes),
            Some(&b"7"[..])
        );
        let g = Refusal::Missing.respond(true, "svc-pdp");
        assert_eq!(
            g.headers().get("grpc-status").map(HeaderValue::as_bytes),
            Some(&b"16"[..])
        );
    }
}
