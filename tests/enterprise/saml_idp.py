"""A real SAML 2.0 identity provider for the SAML tests: pysaml2's IdP (`saml2.server.Server`,
signing with xmlsec1) behind a small HTTP server on a free loopback port, started and stopped
by the test. It answers an AuthnRequest (HTTP-Redirect) for the user the test names with the
HTML form a browser would auto-post to the SP's ACS, and serves its own metadata."""

from __future__ import annotations

import datetime
import html
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.control.pg import free_port


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A fresh RSA-2048 key and a self-signed certificate (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3))
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.crt"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


class IdentityProvider:
    """pysaml2's IdP on loopback. `users` maps a login to its attributes (groups included)."""

    def __init__(
        self,
        folder: Path,
        *sp_metadata: str,
        name: str = "idp",
        entity_id: str | None = None,
        want_signed_requests: bool = False,
    ) -> None:
        from saml2 import BINDING_HTTP_REDIRECT
        from saml2.config import IdPConfig
        from saml2.saml import NAME_FORMAT_BASIC, NAMEID_FORMAT_EMAILADDRESS
        from saml2.server import Server

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.key, self.cert = self_signed(folder, name)
        sp_files = []
        for n, text in enumerate(sp_metadata):  # the SPs it trusts
            sp_files.append(folder / f"{name}-sp{n}-metadata.xml")
            sp_files[-1].write_text(text)
        config = IdPConfig()
        config.load(
            {
                "entityid": entity_id or f"{self.base}/metadata",
                "service": {
                    "idp": {
                        "endpoints": {
                            "single_sign_on_service": [
                                (f"{self.base}/sso/redirect", BINDING_HTTP_REDIRECT)
                            ]
                        },
                        "policy": {
                            "default": {
                                "lifetime": {"minutes": 5},
                                "attribute_restrictions": None,
                                "name_form": NAME_FORMAT_BASIC,
                            }
                        },
                        "name_id_format": [NAMEID_FORMAT_EMAILADDRESS],
                        # verified against the signing certificate in the SP's metadata
                        "want_authn_requests_signed": want_signed_requests,
                    }
                },
                "key_file": str(self.key),
                "cert_file": str(self.cert),
                "xmlsec_binary": shutil.which("xmlsec1"),
                "metadata": {"local": [str(f) for f in sp_files]},
            }
        )
        self.config = config
        self.server = Server(config=config)
        self.users: dict[str, dict[str, list[str]]] = {}
        self.user = ""  # who signs in at the next AuthnRequest
        self._http: ThreadingHTTPServer | None = None

    def metadata(self) -> str:
        from saml2.metadata import create_metadata_string

        return create_metadata_string(None, config=self.config).decode()

    def answer(
        self,
        saml_request: str,
        relay_state: str,
        parse_with: IdentityProvider | None = None,
        sig_alg: str | None = None,
        signature: str | None = None,
        **overrides: Any,
    ) -> dict[str, str]:
        """The ACS URL and the form fields (SAMLResponse, RelayState) for the current user
        (`parse_with`: the IdP the request was sent to, when another one answers it;
        `sig_alg` and `signature`: the HTTP-Redirect binding's signature of the request).
        Raises pysaml2's IncorrectlySigned when the IdP wants signed requests and this one
        is not."""
        from saml2 import BINDING_HTTP_REDIRECT
        from saml2.saml import NAMEID_FORMAT_EMAILADDRESS, NameID

        parser = (parse_with or self).server
        request = parser.parse_authn_request(
            saml_request,
            BINDING_HTTP_REDIRECT,
            relay_state=relay_state or None,
            sigalg=sig_alg,
            signature=signature,
        ).message
        options: dict[str, Any] = {
            "identity": self.users[self.user],
            "in_response_to": request.id,
            "destination": request.assertion_consumer_service_url,
            "sp_entity_id": request.issuer.text,
            "name_id": NameID(format=NAMEID_FORMAT_EMAILADDRESS, text=self.user),
            "sign_response": True,
            "sign_assertion": True,
            "authn": {
                "class_ref": "urn:oasis:names:tc:SAML:2.0:ac:classes:PasswordProtectedTransport",
                "authn_auth": self.base,
            },
            "sign_alg": "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
            "digest_alg": "http://www.w3.org/2001/04/xmlenc#sha256",
        }
        options.update(overrides)
        response = self.server.create_authn_response(**options)
        import base64

        return {
            "action": str(options["destination"]),
            "SAMLResponse": base64.b64encode(str(response).encode()).decode(),
            "RelayState": relay_state,
        }

    def start(self) -> IdentityProvider:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/metadata":
                    self._reply(200, idp.metadata(), "application/samlmetadata+xml")
                elif url.path == "/sso/redirect" and idp.user in idp.users:
                    from saml2.response import IncorrectlySigned

                    try:
                        form = idp.answer(
                            query["SAMLRequest"],
                            query.get("RelayState", ""),
                            sig_alg=query.get("SigAlg"),
                            signature=query.get("Signature"),
                        )
                    except IncorrectlySigned as exc:
                        self._reply(403, f"AuthnRequest refused: {exc}", "text/plain")
                        return
                    inputs = "".join(
                        f'<input type="hidden" name="{k}" value="{html.escape(v)}">'
                        for k, v in form.items()
                        if k != "action"
                    )
                    page = f'<form method="post" action="{form["action"]}">{inputs}</form>'
                    self._reply(200, page, "text/html")
                else:
                    self._reply(403, "no such user or page", "text/plain")

            def _reply(self, code: int, body: str, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *_args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()


def form_fields(page: str) -> tuple[str, dict[str, str]]:
    """The action and hidden fields of the IdP's auto-post form."""
    action = re.search(r'action="([^"]+)"', page)
    assert action, page[:300]
    fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', page))
    return action.group(1), {k: html.unescape(v) for k, v in fields.items()}


def need_saml() -> None:
    if shutil.which("xmlsec1") is None:
        pytest.fail(
            "xmlsec1 is not installed: apt-get install xmlsec1 (scripts/system-packages.txt)"
        )
