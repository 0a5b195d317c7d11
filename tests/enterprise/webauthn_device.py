"""A software WebAuthn authenticator for the tests: soft-webauthn's SoftWebauthnDevice (an
ES256 key on a simulated device), fed the JSON options the server gives a browser and
answering in the JSON form a browser's PublicKeyCredential serialises to."""

from __future__ import annotations

import json
from base64 import urlsafe_b64decode, urlsafe_b64encode
from typing import Any


def b64url(data: bytes) -> str:
    return urlsafe_b64encode(data).decode().rstrip("=")


def unb64url(text: str) -> bytes:
    return urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(self) -> None:
        from soft_webauthn import SoftWebauthnDevice

        self.device = SoftWebauthnDevice()

    def create(self, options_json: str, origin: str) -> dict[str, Any]:
        options = json.loads(options_json)
        options["challenge"] = unb64url(options["challenge"])
        options["user"]["id"] = unb64url(options["user"]["id"])
        answer = self.device.create({"publicKey": options}, origin)
        return self._json(answer, ("clientDataJSON", "attestationObject"))

    def get(self, options_json: str, origin: str) -> dict[str, Any]:
        options = json.loads(options_json)
        options["challenge"] = unb64url(options["challenge"])
        answer = self.device.get({"publicKey": options}, origin)
        keys = ("clientDataJSON", "authenticatorData", "signature", "userHandle")
        return self._json(answer, keys)

    @staticmethod
    def _json(answer: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        raw = answer["rawId"]
        response = {k: b64url(answer["response"][k]) for k in keys if answer["response"].get(k)}
        return {"id": b64url(raw), "rawId": b64url(raw), "response": response,
                "type": "public-key", "clientExtensionResults": {}}  # fmt: skip
