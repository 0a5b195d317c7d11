"""Signed AuthnRequests: with `sp.key_file` and `sp.cert_file` the SP signs each request
(HTTP-Redirect binding: SAMLRequest, RelayState and SigAlg under RSA-SHA256) and says so in
its metadata; a pysaml2 IdP that requires signed requests (want_authn_requests_signed)
answers it, and refuses the same request unsigned, with its RelayState changed, or signed by
a key its metadata of the SP does not name. The key is never shown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from denpex.enterprise.saml import SamlConfig, SamlConfigError
from tests.enterprise.saml_idp import form_fields, self_signed
from tests.enterprise.test_saml import BASE, SP_ID, Sso, make_sso


@pytest.fixture
def signed(tmp_path: Path) -> Iterator[Sso]:
    made = make_sso(tmp_path, self_signed(tmp_path, "sp"))
    try:
        yield made
    finally:
        made.api.close()
        made.idp.stop()


def login_location(sso: Sso) -> str:
    reply = sso.api.client.get("/saml/login?next=/jobs", follow_redirects=False)
    assert reply.status_code == 303, reply.text
    return reply.headers["location"]


def with_query(location: str, **changes: str | None) -> str:
    parts = urlsplit(location)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return parts._replace(query=urlencode(query)).geturl()


def test_the_idp_that_requires_signed_requests_answers_ours(signed: Sso) -> None:
    metadata = signed.api.client.get("/saml/metadata").text
    assert 'AuthnRequestsSigned="true"' in metadata and 'use="signing"' in metadata
    assert "PRIVATE KEY" not in metadata
    location = login_location(signed)
    query = parse_qs(urlsplit(location).query)
    assert query["SigAlg"] == ["http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"]
    at_idp = httpx.get(location, timeout=30)
    assert at_idp.status_code == 200, at_idp.text
    action, fields = form_fields(at_idp.text)
    assert action == f"{BASE}/saml/acs"
    landed = signed.post(fields)
    assert landed.status_code == 200 and 'url=/jobs"' in landed.text
    assert signed.api.client.get("/jobs").status_code == 200


def test_unsigned_altered_or_foreign_signed_requests_are_refused(
    signed: Sso, tmp_path: Path
) -> None:
    location = login_location(signed)
    unsigned = with_query(location, Signature=None, SigAlg=None)
    refused = httpx.get(unsigned, timeout=30)
    assert refused.status_code == 403 and "AuthnRequest refused" in refused.text
    altered = with_query(location, RelayState="/admin")
    assert httpx.get(altered, timeout=30).status_code == 403

    # the same SP id, signing with a key the IdP's metadata of the SP does not name
    (tmp_path / "impostor").mkdir()
    impostor = make_sso(tmp_path / "impostor", self_signed(tmp_path / "impostor", "sp"))
    try:
        forged = login_location(impostor)
        assert (
            httpx.get(signed.idp.base + "/sso/redirect?" + urlsplit(forged).query).status_code
            == 403
        )
    finally:
        impostor.api.close()
        impostor.idp.stop()
    # and the genuine request still goes through
    assert httpx.get(location, timeout=30).status_code == 200


def test_the_signing_key_is_never_shown(tmp_path: Path) -> None:
    key, cert = self_signed(tmp_path, "sp")
    raw = {
        "sp": {"entity_id": SP_ID, "base_url": BASE, "key_file": key.name, "cert_file": cert.name},
        "idp": {
            "entity_id": "https://idp.test",
            "sso_url": "https://idp.test/sso",
            "cert_file": cert.name,
        },
    }
    config = SamlConfig.from_dict(raw, base=tmp_path)
    assert config.signs_requests and "PRIVATE KEY" not in repr(config)
    key_text = key.read_text()
    with pytest.raises(SamlConfigError, match="go together"):
        SamlConfig.from_dict({**raw, "sp": {**raw["sp"], "cert_file": None}}, base=tmp_path)
    with pytest.raises(SamlConfigError, match="not a PEM private key") as wrong:
        SamlConfig.from_dict({**raw, "sp": {**raw["sp"], "key_file": cert.name}}, base=tmp_path)
    assert key_text not in str(wrong.value)
    with pytest.raises(SamlConfigError, match="not a PEM certificate") as swapped:
        SamlConfig.from_dict({**raw, "sp": {**raw["sp"], "cert_file": key.name}}, base=tmp_path)
    assert key_text.splitlines()[1] not in str(swapped.value)
