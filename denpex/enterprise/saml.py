"""SAML 2.0 service provider (python3-saml over xmlsec1): the SP's metadata, the AuthnRequest
sent to the IdP by HTTP-Redirect (signed with the SP's key when one is configured, so an IdP
that requires signed requests accepts it), and the check of the Response the browser POSTs back:
signatures (the Response and its one Assertion, against the IdP's certificate), issuer,
audience, destination and recipient, NotBefore/NotOnOrAfter, InResponseTo (a request this SP
issued and has not seen answered) and replay (each assertion id once); then the assertion's
groups attribute is mapped to a tenant and role by the same rules as OIDC.

It must never accept an unsigned, unsolicited, replayed or expired assertion, nor one meant
for another SP, never say which check failed to the browser (the reason goes to the log), and
never show the SP's private key (not in a repr, an error or the metadata).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import yaml

from denpex.enterprise.oidc import Mapping_, OidcError, bind, parse_mappings, rules_by_tenant

ACS_PATH = "/saml/acs"
METADATA_PATH = "/saml/metadata"


class SamlError(Exception):
    """A response refused (the reason is for the log, never for the browser)."""


class SamlConfigError(ValueError):
    """A SAML configuration that cannot be used: says which field and why."""


class SamlLedger(Protocol):
    """Ids every replica must agree on (the store keeps them)."""

    def remember_request(self, request_id: str, expires_ns: int) -> None: ...

    def take_request(self, request_id: str, now_ns: int) -> bool:
        """True once for a request id remembered and not expired; False afterwards."""
        ...

    def first_use(self, assertion_id: str, expires_ns: int, now_ns: int) -> bool:
        """True the first time an assertion id is presented; False for a replay."""
        ...


def _need() -> Any:
    try:
        from onelogin.saml2 import settings
    except ImportError:  # pragma: no cover - the message is the point
        raise SamlConfigError(
            "SAML needs python3-saml and xmlsec1: pip install 'denpex[saml]' and "
            "apt-get install xmlsec1"
        ) from None
    return settings


@dataclass(frozen=True)
class SamlConfig:
    sp_entity_id: str
    base_url: str  # the server's public URL: the ACS is base_url + /saml/acs
    idp: Mapping[str, Any]  # python3-saml's idp settings (entityId, SSO URL, certificate)
    mappings: tuple[Mapping_, ...]
    groups_attribute: str = "groups"
    want_response_signed: bool = True  # the Assertion must always be signed; this adds the Response
    request_ttl_s: int = 600  # how long an AuthnRequest may wait for its answer
    session_s: int = 12 * 3600  # the UI session a SAML sign-in opens
    sp_cert: str | None = None  # PEM: the SP's signing certificate (in its metadata)
    sp_key: str | None = field(default=None, repr=False)  # PEM: signs the AuthnRequests

    @property
    def signs_requests(self) -> bool:
        return self.sp_key is not None

    @property
    def acs_url(self) -> str:
        return self.base_url + ACS_PATH

    def rules_by_tenant(self) -> dict[str, list[dict[str, str]]]:
        return rules_by_tenant(self.mappings)

    @classmethod
    def load(cls, path: str | Path) -> SamlConfig:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SamlConfigError(f"{path}: {exc}") from None
        return cls.from_dict(raw, str(path), Path(path).parent)

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], where: str = "saml", base: Path | None = None
    ) -> SamlConfig:
        try:
            sp = raw["sp"]
            idp = _idp_settings(raw["idp"], where, base or Path.cwd())
            mappings = parse_mappings(raw.get("mappings") or (), where)
            if any(m.client is not None for m in mappings):
                raise SamlConfigError(f"{where}: SAML mappings name groups, not clients")
            config = cls(
                sp_entity_id=str(sp["entity_id"]),
                base_url=str(sp["base_url"]).rstrip("/"),
                idp=idp,
                mappings=mappings,
                groups_attribute=str(raw.get("groups_attribute", "groups")),
                want_response_signed=bool(raw.get("want_response_signed", True)),
                request_ttl_s=int(raw.get("request_ttl_s", 600)),
                session_s=int(raw.get("session_s", 12 * 3600)),
                **_sp_signing(sp, where, base or Path.cwd()),
            )
        except (KeyError, TypeError) as exc:
            raise SamlConfigError(f"{where}: missing or malformed {exc}") from None
        except OidcError as exc:
            raise SamlConfigError(str(exc)) from None
        if urlsplit(config.base_url).scheme not in ("http", "https"):
            raise SamlConfigError(f"{where}: sp.base_url must be an http(s) URL")
        return config


def _sp_signing(sp: Mapping[str, Any], where: str, base: Path) -> dict[str, str]:
    """The SP's signing key and certificate from `sp.key_file` and `sp.cert_file` (PEM), both
    or neither; the key's text is never part of an error."""
    names = [n for n in ("key_file", "cert_file") if sp.get(n)]
    if not names:
        return {}
    if len(names) == 1:
        raise SamlConfigError(f"{where}: sp.key_file and sp.cert_file go together")
    found = {}
    for name, out in (("key_file", "sp_key"), ("cert_file", "sp_cert")):
        try:
            found[out] = (base / str(sp[name])).read_text()
        except OSError as exc:
            raise SamlConfigError(f"{where}: sp.{name}: {exc.strerror}") from None
    if "PRIVATE KEY-----" not in found["sp_key"]:
        raise SamlConfigError(f"{where}: sp.key_file is not a PEM private key")
    if "BEGIN CERTIFICATE-----" not in found["sp_cert"]:
        raise SamlConfigError(f"{where}: sp.cert_file is not a PEM certificate")
    return found


def _idp_settings(raw: Mapping[str, Any], where: str, base: Path) -> dict[str, Any]:
    """The IdP from its metadata file (`metadata_file`) or from `entity_id`, `sso_url` and
    `cert_file` (PEM)."""
    if raw.get("metadata_file"):
        from onelogin.saml2.idp_metadata_parser import OneLogin_Saml2_IdPMetadataParser

        path = base / str(raw["metadata_file"])
        try:
            parsed = OneLogin_Saml2_IdPMetadataParser.parse(path.read_text())
        except OSError as exc:
            raise SamlConfigError(f"{where}: idp.metadata_file: {exc}") from None
        idp = dict(parsed.get("idp") or {})
        if not idp.get("entityId") or not (idp.get("x509cert") or idp.get("x509certMulti")):
            raise SamlConfigError(f"{where}: the IdP metadata names no entityID or certificate")
        return idp
    try:
        cert = (base / str(raw["cert_file"])).read_text()
    except OSError as exc:
        raise SamlConfigError(f"{where}: idp.cert_file: {exc}") from None
    return {
        "entityId": str(raw["entity_id"]),
        "singleSignOnService": {
            "url": str(raw["sso_url"]),
            "binding": "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect",
        },
        "x509cert": cert,
    }


def _settings_of(settings: dict[str, Any], *, sp_only: bool) -> Any:
    module = _need()
    from onelogin.saml2.errors import OneLogin_Saml2_Error

    try:
        return module.OneLogin_Saml2_Settings(settings, sp_validation_only=sp_only)
    except OneLogin_Saml2_Error as exc:
        raise SamlConfigError(f"the SAML settings are not usable: {exc}") from None


def _sp_settings(
    entity_id: str, acs_url: str, cert: str | None = None, key: str | None = None
) -> dict[str, Any]:
    sp: dict[str, Any] = {
        "entityId": entity_id,
        "assertionConsumerService": {
            "url": acs_url,
            "binding": "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST",
        },
        "NameIDFormat": "urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified",
    }
    if cert is not None:
        sp["x509cert"] = cert
    if key is not None:
        sp["privateKey"] = key
    return sp


SIGNING = {
    "signatureAlgorithm": "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
    "digestAlgorithm": "http://www.w3.org/2001/04/xmlenc#sha256",
}


def sp_metadata(
    entity_id: str, base_url: str, cert: str | None = None, key: str | None = None
) -> str:
    """The SP's metadata XML (what an IdP is given to trust this server), validated; with
    the signing certificate and key (python3-saml checks they are both there; the key is not
    part of the metadata), it names the certificate and says AuthnRequestsSigned="true"."""
    sp = _sp_settings(entity_id, base_url.rstrip("/") + ACS_PATH, cert, key)
    security = {"authnRequestsSigned": key is not None, **SIGNING}
    settings = _settings_of({"sp": sp, "security": security}, sp_only=True)
    xml = settings.get_sp_metadata()
    errors = settings.validate_metadata(xml)
    if errors:
        raise SamlConfigError(f"the SP metadata does not validate: {errors}")
    return xml.decode() if isinstance(xml, bytes) else str(xml)


@dataclass(frozen=True, slots=True)
class SamlIdentity:
    name_id: str
    groups: tuple[str, ...]
    attributes: dict[str, list[str]]
    assertion_id: str
    session_index: str | None


class SamlServiceProvider:
    def __init__(
        self,
        config: SamlConfig,
        ledger: SamlLedger,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.clock = clock
        self.settings = _settings_of(self._settings(), sp_only=False)

    def _settings(self) -> dict[str, Any]:
        c = self.config
        return {
            "strict": True,
            "debug": False,
            "sp": _sp_settings(c.sp_entity_id, c.acs_url, c.sp_cert, c.sp_key),
            "idp": dict(c.idp),
            "security": {
                "authnRequestsSigned": c.signs_requests,
                **SIGNING,
                "wantAssertionsSigned": True,
                "wantMessagesSigned": c.want_response_signed,
                "wantAttributeStatement": False,
                "rejectDeprecatedAlgorithm": True,
                "requestedAuthnContext": False,
            },
        }

    def metadata(self) -> str:
        c = self.config
        return sp_metadata(c.sp_entity_id, c.base_url, c.sp_cert, c.sp_key)

    def login_url(self, relay_state: str = "") -> str:
        """The IdP URL to send the browser to, with a fresh AuthnRequest (remembered)."""
        from onelogin.saml2.authn_request import OneLogin_Saml2_Authn_Request
        from onelogin.saml2.utils import OneLogin_Saml2_Utils

        request = OneLogin_Saml2_Authn_Request(self.settings)
        now_ns = int(self.clock() * 1e9)
        self.ledger.remember_request(
            request.get_id(), now_ns + self.config.request_ttl_s * 1_000_000_000
        )
        params = {"SAMLRequest": request.get_request()}
        if relay_state:
            params["RelayState"] = relay_state
        if self.config.signs_requests:
            # the HTTP-Redirect binding signs the query (SAMLRequest, RelayState, SigAlg)
            from onelogin.saml2.auth import OneLogin_Saml2_Auth

            OneLogin_Saml2_Auth(self._request_data(), self.settings).add_request_signature(
                params, SIGNING["signatureAlgorithm"]
            )
        url = self.config.idp["singleSignOnService"]["url"]
        return str(OneLogin_Saml2_Utils.redirect(url, params))

    def consume(self, saml_response: str) -> SamlIdentity:
        """The identity a POSTed SAMLResponse (base64) asserts, after every check."""
        from onelogin.saml2.response import OneLogin_Saml2_Response

        now_ns = int(self.clock() * 1e9)
        try:
            response = OneLogin_Saml2_Response(self.settings, saml_response)
            in_response_to = response.get_in_response_to()
            if not in_response_to:
                raise SamlError("an unsolicited response (no InResponseTo): refused")
            response.is_valid(self._request_data(), in_response_to, raise_exceptions=True)
            if self.config.sp_entity_id not in response.get_audiences():
                raise SamlError("the assertion names no audience of ours")
            assertion_id = str(response.get_assertion_id() or "")
            until = response.get_assertion_not_on_or_after()
        except SamlError:
            raise
        except Exception as exc:  # python3-saml raises its own errors, lxml's and ValueError
            raise SamlError(f"response refused: {type(exc).__name__}: {exc}") from None
        if not self.ledger.take_request(in_response_to, now_ns):
            raise SamlError(f"InResponseTo {in_response_to!r} is no open request of this SP")
        expires_ns = int(until * 1e9) if until else now_ns + self.config.request_ttl_s * 10**9
        if not assertion_id or not self.ledger.first_use(assertion_id, expires_ns, now_ns):
            raise SamlError(f"assertion {assertion_id!r} was presented before: a replay")
        attributes = {str(k): [str(v) for v in vs] for k, vs in response.get_attributes().items()}
        groups = tuple(attributes.get(self.config.groups_attribute, ()))
        return SamlIdentity(
            name_id=str(response.get_nameid()),
            groups=groups,
            attributes=attributes,
            assertion_id=assertion_id,
            session_index=response.get_session_index(),
        )

    def _request_data(self) -> dict[str, Any]:
        """The ACS as configured (behind a proxy the URL received may differ): python3-saml
        checks Destination and Recipient against it."""
        parts = urlsplit(self.config.acs_url)
        https = parts.scheme == "https"
        return {
            "https": "on" if https else "off",
            "http_host": parts.netloc,  # with its port, when it names one
            "script_name": parts.path,
            "get_data": {},
            "post_data": {},
        }

    def binding(self, identity: SamlIdentity, tenant: str | None = None) -> tuple[str, str]:
        """(tenant, role) of the identity's groups; SamlError when no rule gives one."""
        try:
            return bind(self.config.mappings, identity.name_id, identity.groups, None, tenant)
        except OidcError as exc:
            raise SamlError(str(exc)) from None
