"""OIDC against a real OpenID provider (node-oidc-provider on loopback): discovery, tokens
from client credentials and from the authorization code flow with PKCE, JWKS caching and
rotation, every claim check (iss, aud, exp, nbf, nonce), `alg: none` and HS/RS confusion
refused, groups and clients mapped to a tenant and role, the control plane accepting those
tokens through its one auth dependency, and `denpex login` end to end."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
import urllib.parse
import warnings

import httpx
import pytest
from joserfc import jwt

from denpex.enterprise import OidcConfig, OidcConfigError, OidcError, OidcVerifier
from tests.enterprise.conftest import sign_in, signing_key


def config_for(provider, **extra) -> OidcConfig:
    return OidcConfig.from_dict(
        {
            "issuer": provider.issuer,
            "audiences": ["urn:denpex:api", "denpex-cli"],
            "mappings": [
                {"group": "gpu-sre", "tenant": "acme", "role": "operator"},
                {"group": "ml-research", "tenant": "research", "role": "viewer"},
                {"client": "denpex-agent", "tenant": "acme", "role": "operator"},
            ],
            "login": {"client_id": "denpex-cli", "scopes": ["openid", "groups"]},
            **extra,
        }
    )


def b64(data: dict | bytes) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def forged(provider, key=None, *, header=None, **claims) -> str:
    """A token signed with the provider's own private key (as if the provider issued it)."""
    now = int(time.time())
    body = {
        "iss": provider.issuer,
        "sub": "alice",
        "aud": "urn:denpex:api",
        "iat": now,
        "exp": now + 300,
        "groups": ["gpu-sre"],
        **claims,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(header or {"alg": "RS256", "kid": "k1"}, body, key or provider.keys[0])


def code_flow(provider, user: str, nonce: str = "n-0S6_WzA2Mj") -> dict:
    """The authorization code flow with PKCE as a relying party runs it; returns the tokens."""
    from denpex.enterprise.oidc_login import pkce_pair

    doc = httpx.get(provider.issuer + "/.well-known/openid-configuration").json()
    verifier, challenge = pkce_pair()
    redirect = "http://127.0.0.1:43117/callback"
    query = {
        "response_type": "code",
        "client_id": "denpex-cli",
        "redirect_uri": redirect,
        "scope": "openid groups",
        "state": "st",
        "nonce": nonce,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    back = sign_in(
        doc["authorization_endpoint"] + "?" + urllib.parse.urlencode(query), user, redirect
    )
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(back).query))
    assert params["state"] == "st"
    form = {
        "grant_type": "authorization_code",
        "code": params["code"],
        "redirect_uri": redirect,
        "client_id": "denpex-cli",
        "code_verifier": verifier,
    }
    reply = httpx.post(doc["token_endpoint"], data=form)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_client_credentials_token_maps_to_its_tenant(provider):
    oidc = OidcVerifier(config_for(provider))
    identity = oidc.verify(provider.client_credentials())
    assert (identity.subject, identity.client) == ("denpex-agent", "denpex-agent")
    assert oidc.binding(identity) == ("acme", "operator")
    doc = oidc.discovery.document()
    assert doc["issuer"] == provider.issuer and doc["jwks_uri"].startswith(provider.issuer)


def test_authorization_code_with_pkce_and_nonce(provider):
    oidc = OidcVerifier(config_for(provider))
    tokens = code_flow(provider, "alice", nonce="abc123")
    identity = oidc.verify(tokens["id_token"], nonce="abc123")
    assert identity.subject == "alice" and identity.groups == ("gpu-sre",)
    assert oidc.binding(identity) == ("acme", "operator")
    with pytest.raises(OidcError, match="nonce"):
        oidc.verify(tokens["id_token"], nonce="another")
    bob = oidc.verify(code_flow(provider, "bob")["id_token"])
    assert oidc.binding(bob) == ("research", "viewer")
    carol = oidc.verify(code_flow(provider, "carol")["id_token"])
    with pytest.raises(OidcError, match="no mapping"):
        oidc.binding(carol)


def test_a_user_token_does_not_take_a_client_mapping(provider):
    oidc = OidcVerifier(config_for(provider))
    identity = oidc.verify(forged(provider, groups=[], client_id="denpex-agent"))
    with pytest.raises(OidcError, match="no mapping"):
        oidc.binding(identity)


def test_pkce_is_required_by_the_provider(provider):
    doc = httpx.get(provider.issuer + "/.well-known/openid-configuration").json()
    query = {
        "response_type": "code",
        "client_id": "denpex-cli",
        "redirect_uri": "http://127.0.0.1:43117/callback",
        "scope": "openid",
        "state": "st",
    }
    reply = httpx.get(doc["authorization_endpoint"] + "?" + urllib.parse.urlencode(query))
    assert reply.status_code in (302, 303, 400)
    assert "error=invalid_request" in reply.headers["location"]
    assert "requires+PKCE" in reply.headers["location"]


def test_crafted_tokens_are_refused(provider):
    oidc = OidcVerifier(config_for(provider))
    assert oidc.verify(forged(provider)).subject == "alice"  # the crafting itself is sound
    now = int(time.time())
    claims = json.dumps(
        {"iss": provider.issuer, "sub": "alice", "aud": "urn:denpex:api", "exp": now + 300}
    )
    none = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims.encode())}."
    # HS256 with the provider's public key as the HMAC secret (the RS/HS confusion attack)
    from joserfc.jwk import OctKey

    public_pem = provider.keys[0].as_pem(private=False)
    with warnings.catch_warnings():  # joserfc warns that a PEM is no HMAC secret: the point
        warnings.simplefilter("ignore")
        hmac_key = OctKey.import_key(public_pem)
    confused = jwt.encode({"alg": "HS256", "kid": "k1"}, json.loads(claims), hmac_key)
    attacker = signing_key("k1")  # the right kid, another key
    cases = {
        "alg none": (none, "not allowed"),
        "HS256 with the public key": (confused, "not allowed"),
        "another key": (forged(provider, attacker), "BadSignature"),
        "wrong issuer": (forged(provider, iss="http://evil.example"), "iss"),
        "wrong audience": (forged(provider, aud="someone-else"), "audience"),
        "expired": (forged(provider, exp=now - 3600, iat=now - 7200), "Expired"),
        "not yet valid": (forged(provider, nbf=now + 3600), "nbf|not valid yet|InvalidClaim"),
        "no exp": (forged(provider, exp=None), "exp"),
        "unknown kid": (forged(provider, header={"alg": "RS256", "kid": "k9"}), "no signing key"),
    }
    for name, (token, reason) in cases.items():
        with pytest.raises(OidcError, match=reason):
            oidc.verify(token)
        print(f"refused: {name}")


def test_symmetric_algorithms_cannot_be_configured(provider):
    with pytest.raises(OidcConfigError, match="HS256"):
        config_for(provider, algorithms=["RS256", "HS256"])
    with pytest.raises(OidcConfigError, match="none"):
        config_for(provider, algorithms=["none"])


def test_jwks_is_cached_and_fetched_again_on_rotation(provider):
    oidc = OidcVerifier(config_for(provider, jwks_refetch_s=0.0))
    for _ in range(5):
        oidc.verify(provider.client_credentials())
    assert oidc.jwks.fetches == 1
    old = provider.client_credentials()
    provider.restart([signing_key("k2")])  # the provider rotates: k1 gone, k2 signs
    fresh = provider.client_credentials()
    assert json.loads(base64.urlsafe_b64decode(fresh.split(".")[0] + "==="))["kid"] == "k2"
    assert oidc.verify(fresh).subject == "denpex-agent"
    assert oidc.jwks.fetches == 2
    with pytest.raises(OidcError, match="no signing key"):
        oidc.verify(old)


def test_unknown_kids_do_not_hammer_the_provider(provider):
    oidc = OidcVerifier(config_for(provider, jwks_refetch_s=60.0))
    oidc.verify(provider.client_credentials())
    for _ in range(5):
        with pytest.raises(OidcError):
            oidc.verify(forged(provider, header={"alg": "RS256", "kid": "nope"}))
    assert oidc.jwks.fetches == 1


def test_the_control_plane_accepts_oidc_tokens(provider, tmp_path):
    from tests.control.conftest import Api

    api = Api(f"sqlite:///{tmp_path / 'cp.db'}", oidc=config_for(provider))
    try:
        agent = {"Authorization": f"Bearer {provider.client_credentials()}"}
        assert api.client.get("/api/v1/incidents", headers=agent).status_code == 200
        bob = {"Authorization": f"Bearer {code_flow(provider, 'bob')['id_token']}"}
        assert api.client.get("/api/v1/hosts", headers=bob).status_code == 200
        refused = api.client.post("/api/v1/incidents/1/resolve", headers=bob)
        assert refused.status_code == 403
        auditor = {"Authorization": f"Bearer {api.token('research', 'auditor')}"}
        denials = api.client.get("/api/v1/denials", headers=auditor).json()["items"]
        assert [(d["principal"], d["action"]) for d in denials] == [("oidc:bob", "incidents:write")]
        for bad in (
            "eyJhbGciOiJub25lIn0.e30.",
            forged(provider, aud="x"),
            forged(provider, signing_key("k1")),
        ):
            reply = api.client.get("/api/v1/incidents", headers={"Authorization": f"Bearer {bad}"})
            assert reply.status_code == 401
            assert reply.json()["error"]["message"] == "invalid bearer token"
    finally:
        api.close()


def test_a_token_mapped_to_two_tenants_names_one(provider, tmp_path):
    config = config_for(provider)
    both = OidcConfig.from_dict(
        {
            "issuer": provider.issuer,
            "audiences": ["urn:denpex:api"],
            "mappings": [
                {"group": "gpu-sre", "tenant": "acme", "role": "operator"},
                {"group": "gpu-sre", "tenant": "globex", "role": "viewer"},
            ],
        }
    )
    oidc = OidcVerifier(both)
    identity = oidc.verify(forged(provider))
    with pytest.raises(OidcError, match="name one"):
        oidc.binding(identity)
    assert oidc.binding(identity, "globex") == ("globex", "viewer")
    with pytest.raises(OidcError):
        oidc.binding(identity, "initech")
    assert config.audiences


def test_denpex_login_stores_a_verified_token_readable_by_the_user_alone(provider, tmp_path):
    oidc_file = tmp_path / "oidc.yaml"
    oidc_file.write_text(
        f"issuer: {provider.issuer}\naudiences: [denpex-cli]\n"
        "mappings: [{group: gpu-sre, tenant: acme, role: operator}]\n"
        "login: {client_id: denpex-cli, scopes: [openid, groups]}\n"
    )
    store = tmp_path / "config" / "denpex" / "credentials.json"
    env = {**os.environ, "DENPEX_CREDENTIALS": str(store)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "denpex", "login", "--oidc", str(oidc_file), "--timeout", "60"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        assert "open this URL" in proc.stderr.readline()
        url = proc.stderr.readline().strip()
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        assert query["code_challenge_method"] == "S256" and query["nonce"]
        assert query["redirect_uri"].startswith("http://127.0.0.1:")
        back = sign_in(url, "alice", query["redirect_uri"])
        assert httpx.get(back).status_code == 200  # the loopback listener takes the code
        assert proc.wait(60) == 0, proc.stderr.read()
        assert "signed in as alice" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    saved = json.loads(store.read_text())
    identity = OidcVerifier(config_for(provider)).verify(saved["id_token"], nonce=query["nonce"])
    assert identity.subject == "alice"


def test_denpex_login_refuses_a_forged_redirect(provider, tmp_path):
    oidc_file = tmp_path / "oidc.yaml"
    oidc_file.write_text(
        f"issuer: {provider.issuer}\naudiences: [denpex-cli]\nlogin: {{client_id: denpex-cli}}\n"
    )
    store = tmp_path / "credentials.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "denpex", "login", "--oidc", str(oidc_file), "--timeout", "60"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DENPEX_CREDENTIALS": str(store)},
    )
    try:
        assert proc.stderr is not None
        proc.stderr.readline()
        url = proc.stderr.readline().strip()
        redirect = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))["redirect_uri"]
        httpx.get(redirect, params={"code": "stolen", "state": "not-the-one-sent"})
        assert proc.wait(60) == 2
        assert "another state" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not store.exists()
