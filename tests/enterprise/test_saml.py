"""The SAML 2.0 service provider against a real pysaml2 IdP on loopback (signing with
xmlsec1): metadata, the AuthnRequest redirect, a signed response opening a UI session for the
mapped tenant and role (and the audit saying so), logout ending it; and refusal of what an
attacker sends: unsigned, assertion-unsigned, forged (another key), tampered, expired,
wrong-audience, unsolicited, replayed and signature-wrapped (XSW) responses, none of which
opens a session."""

from __future__ import annotations

import base64
import copy
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from denpex.control import audit_log
from denpex.core import audit
from denpex.enterprise.saml import SamlConfig, sp_metadata
from tests.control.conftest import Api
from tests.enterprise.saml_idp import IdentityProvider, form_fields, need_saml

SP_ID = "https://denpex.test/saml/metadata"
BASE = "http://denpex.test"  # the TestClient's origin (set below): the ACS the IdP posts to
OTHER_SP = "https://other-sp.test/metadata"
ALICE = "alice@corp.test"
NS = {
    "samlp": "urn:oasis:names:tc:SAML:2.0:protocol",
    "saml": "urn:oasis:names:tc:SAML:2.0:assertion",
    "ds": "http://www.w3.org/2000/09/xmldsig#",
}


class Sso:
    def __init__(self, api: Api, idp: IdentityProvider) -> None:
        self.api = api
        self.idp = idp

    def start(self, next_path: str = "/jobs") -> tuple[str, str]:
        """GET /saml/login: the AuthnRequest and RelayState it redirects to the IdP with."""
        reply = self.api.client.get(f"/saml/login?next={next_path}", follow_redirects=False)
        assert reply.status_code == 303, reply.text
        location = reply.headers["location"]
        assert location.startswith(self.idp.base + "/sso/redirect?")
        query = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
        return query["SAMLRequest"], query.get("RelayState", "")

    def post(self, fields: dict[str, str]) -> httpx.Response:
        form = {k: v for k, v in fields.items() if k != "action"}
        return self.api.client.post("/saml/acs", data=form, follow_redirects=False)

    def records(self, kind: str) -> list[dict]:
        lines = audit_log.export_lines(self.api.runtime.db)
        return [r for r in map(audit.loads_record, lines) if r["kind"] == kind]


def make_sso(tmp_path: Path, sp_signing: tuple[Path, Path] | None = None, **options) -> Sso:
    """The server's SP and a pysaml2 IdP that trusts it; with `sp_signing` (key, cert) the SP
    signs its AuthnRequests and the IdP requires that they are."""
    need_saml()
    key, cert = (p.read_text() for p in sp_signing) if sp_signing else (None, None)
    other_sp = sp_metadata(OTHER_SP, "https://other.test")  # an SP the IdP also serves
    idp = IdentityProvider(
        tmp_path,
        sp_metadata(SP_ID, BASE, cert, key),
        other_sp,
        want_signed_requests=cert is not None,
    ).start()
    idp.users = {
        ALICE: {"mail": [ALICE], "groups": ["sre"]},
        "mallory@corp.test": {"mail": ["mallory@corp.test"], "groups": ["contractors"]},
    }
    idp.user = ALICE
    (tmp_path / "idp-metadata.xml").write_text(idp.metadata())
    sp: dict[str, str] = {"entity_id": SP_ID, "base_url": BASE}
    if sp_signing:
        sp.update(key_file=sp_signing[0].name, cert_file=sp_signing[1].name)
    config = SamlConfig.from_dict(
        {
            "sp": sp,
            "idp": {"metadata_file": "idp-metadata.xml"},
            "mappings": [
                {"group": "sre", "tenant": "acme", "role": "operator"},
                {"group": "admins", "tenant": "acme", "role": "admin"},
            ],
        },
        base=tmp_path,
    )
    api = Api(f"sqlite:///{tmp_path / 'control.db'}", saml=config, **options)
    api.client.base_url = BASE
    return Sso(api, idp)


@pytest.fixture
def sso(tmp_path: Path) -> Iterator[Sso]:
    made = make_sso(tmp_path)
    try:
        yield made
    finally:
        made.api.close()
        made.idp.stop()


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found
    return found.group(1)


def test_metadata_names_the_sp_and_its_acs(sso: Sso) -> None:
    reply = sso.api.client.get("/saml/metadata")
    assert reply.status_code == 200
    assert f'entityID="{SP_ID}"' in reply.text and f'Location="{BASE}/saml/acs"' in reply.text
    assert "Sign in with your identity provider" in sso.api.client.get("/login").text


def test_a_signed_response_from_the_idp_opens_a_session(sso: Sso) -> None:
    reply = sso.api.client.get("/saml/login?next=/jobs", follow_redirects=False)
    at_idp = httpx.get(reply.headers["location"], timeout=30)  # the real IdP over HTTP
    assert at_idp.status_code == 200, at_idp.text
    action, fields = form_fields(at_idp.text)
    assert action == f"{BASE}/saml/acs"
    signed = base64.b64decode(fields["SAMLResponse"])
    assert signed.count(b"SignatureValue>") == 4  # open and close tags: Response and Assertion
    landed = sso.post(fields)
    assert landed.status_code == 200 and 'url=/jobs"' in landed.text
    assert sso.api.client.get("/jobs").status_code == 200
    [login] = sso.records("login.succeeded")
    assert login["tenant"] == "acme" and login["result"]["method"] == "saml"
    assert login["result"]["role"] == "operator" and login["result"]["name_id"] == ALICE
    [minted] = sso.records("token.created")
    assert minted["result"]["owner"] == f"saml:{ALICE}" and minted["actor"] == f"saml:{ALICE}"

    csrf = csrf_of(sso.api.client.get("/jobs").text)
    cookie = sso.api.client.cookies["denpex_session"]
    assert sso.api.client.post("/logout", data={"csrf": csrf}).status_code == 200
    [out] = sso.records("logout")
    assert out["result"] == {"token_revoked": True}
    sso.api.client.cookies.set("denpex_session", cookie)  # the old cookie: its token is gone
    assert sso.api.client.get("/jobs", follow_redirects=False).status_code == 303

    assert sso.post(fields).status_code == 401  # the same response again: a replay
    assert len(sso.records("login.failed")) == 1


def refused(sso: Sso, fields: dict[str, str]) -> None:
    before = len(sso.records("login.failed"))
    reply = sso.post(fields)
    assert reply.status_code == 401, reply.text[:300]
    assert "not accepted" in reply.text
    assert "denpex_session" not in reply.headers.get("set-cookie", "")
    assert len(sso.records("login.failed")) == before + 1
    assert not sso.records("login.succeeded")


def xml_of(fields: dict[str, str]):
    from lxml import etree

    return etree.fromstring(base64.b64decode(fields["SAMLResponse"]))


def with_xml(fields: dict[str, str], root) -> dict[str, str]:
    from lxml import etree

    return {**fields, "SAMLResponse": base64.b64encode(etree.tostring(root)).decode()}


def test_unsigned_or_assertion_unsigned_responses_are_refused(sso: Sso) -> None:
    request, relay = sso.start()
    refused(sso, sso.idp.answer(request, relay, sign_response=False, sign_assertion=False))
    request, relay = sso.start()
    refused(sso, sso.idp.answer(request, relay, sign_response=True, sign_assertion=False))
    request, relay = sso.start()  # signed, but with SHA-1 (pysaml2's default): deprecated
    sha1 = "http://www.w3.org/2000/09/xmldsig#rsa-sha1"
    refused(sso, sso.idp.answer(request, relay, sign_alg=sha1))


def test_a_response_signed_by_another_key_is_refused(sso: Sso, tmp_path: Path) -> None:
    evil = IdentityProvider(
        tmp_path, sp_metadata(SP_ID, BASE), name="evil", entity_id=sso.idp.config.entityid
    )
    evil.users = sso.idp.users
    evil.user = ALICE
    request, relay = sso.start()
    refused(sso, evil.answer(request, relay, parse_with=sso.idp))


def test_a_tampered_assertion_is_refused(sso: Sso) -> None:
    request, relay = sso.start()
    fields = sso.idp.answer(request, relay)
    root = xml_of(fields)
    [value] = root.xpath("//saml:Attribute[@Name='groups']/saml:AttributeValue", namespaces=NS)
    value.text = "admins"
    refused(sso, with_xml(fields, root))


def test_wrong_audience_expired_unsolicited_and_unmapped_are_refused(
    sso: Sso, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, relay = sso.start()
    refused(sso, sso.idp.answer(request, relay, sp_entity_id=OTHER_SP))

    refused(sso, sso.idp.answer(sso.start()[0], relay, in_response_to="id-never-sent"))

    request, relay = sso.start()
    late = sso.idp.answer(request, relay)
    from onelogin.saml2.utils import OneLogin_Saml2_Utils

    real_now = OneLogin_Saml2_Utils.now
    monkeypatch.setattr(OneLogin_Saml2_Utils, "now", staticmethod(lambda: real_now() + 600))
    refused(sso, late)  # presented ten minutes on: past its NotOnOrAfter (5 minutes)
    monkeypatch.undo()

    sso.idp.user = "mallory@corp.test"  # signed and valid, but her group maps to nothing
    request, relay = sso.start()
    refused(sso, sso.idp.answer(request, relay))


def test_signature_wrapping_is_refused(sso: Sso) -> None:
    """XSW: the signed assertion stays in the document (so a signature still verifies) while
    an unsigned copy granting more sits where a naive SP reads its attributes."""
    for variant in ("sibling-before", "inside-extensions", "evil-wraps-signed"):
        request, relay = sso.start()
        fields = sso.idp.answer(request, relay, sign_response=False, sign_assertion=True)
        root = xml_of(fields)
        [signed] = root.xpath("saml:Assertion", namespaces=NS)
        evil = copy.deepcopy(signed)
        for sig in evil.xpath("ds:Signature", namespaces=NS):
            evil.remove(sig)
        evil.set("ID", "_evil" + str(time.time_ns()))
        for value in evil.xpath("//saml:AttributeValue", namespaces=NS):
            if value.text == "sre":
                value.text = "admins"
        if variant == "sibling-before":
            signed.addprevious(evil)
        elif variant == "inside-extensions":
            from lxml import etree

            root.remove(signed)
            extensions = etree.SubElement(root, f"{{{NS['samlp']}}}Extensions")
            root.insert(2, extensions)
            extensions.append(signed)
            root.append(evil)
        else:
            root.replace(signed, evil)
            evil.xpath("saml:Subject", namespaces=NS)[0].append(signed)
        refused(sso, with_xml(fields, root))


def test_the_ledger_accepts_each_request_and_assertion_once(tmp_path: Path) -> None:
    from denpex.control.db import Database
    from denpex.control.sso import StoreSamlLedger

    db = Database(f"sqlite:///{tmp_path / 'ledger.db'}")
    db.migrate()
    try:
        ledger = StoreSamlLedger(db)
        ledger.remember_request("r1", expires_ns=2_000)
        assert not ledger.take_request("r1", now_ns=2_000)  # expired
        ledger.remember_request("r2", expires_ns=5_000)
        assert not ledger.take_request("r-unknown", now_ns=1_000)
        assert ledger.take_request("r2", now_ns=1_000)
        assert not ledger.take_request("r2", now_ns=1_001)  # answered already
        assert ledger.first_use("a1", expires_ns=9_000, now_ns=1_000)
        assert not ledger.first_use("a1", expires_ns=9_000, now_ns=1_002)  # a replay
    finally:
        db.dispose()


def test_scim_decides_for_the_people_it_provisioned(sso: Sso) -> None:
    """A person SCIM knows signs in with the role SCIM's groups give, and not at all once
    SCIM deactivated them, whatever the assertion's groups say."""
    scim = {"Authorization": f"Bearer {sso.api.token('acme', 'provisioner')}",
            "Content-Type": "application/scim+json"}  # fmt: skip
    user = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": ALICE}
    made = sso.api.client.post("/scim/v2/Users", headers=scim, json=user)
    assert made.status_code == 201, made.text
    group = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"], "displayName": "admins",
             "members": [{"value": made.json()["id"]}]}  # fmt: skip
    assert sso.api.client.post("/scim/v2/Groups", headers=scim, json=group).status_code == 201
    request, relay = sso.start()
    assert sso.post(sso.idp.answer(request, relay)).status_code == 200
    assert sso.records("login.succeeded")[-1]["result"]["role"] == "admin"  # not operator

    off = {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
           "Operations": [{"op": "replace", "path": "active", "value": False}]}  # fmt: skip
    reply = sso.api.client.patch(f"/scim/v2/Users/{made.json()['id']}", headers=scim, json=off)
    assert reply.status_code in (200, 204)
    assert sso.api.client.get("/jobs", follow_redirects=False).status_code == 303  # revoked
    request, relay = sso.start()
    assert sso.post(sso.idp.answer(request, relay)).status_code == 401
