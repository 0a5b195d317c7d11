"""WebAuthn registration and assertion checked by py_webauthn against soft-webauthn's
software authenticator: a good ceremony passes; another challenge, another origin or RP id,
a tampered signature and a counter that does not advance (a cloned device) are refused."""

from __future__ import annotations

import copy

import pytest

from denpex.enterprise import webauthn_factor as wa
from denpex.enterprise.mfa import MfaError
from tests.enterprise.webauthn_device import Authenticator, b64url, unb64url

RP, ORIGIN = "denpex.test", "https://denpex.test"


def registered(device: Authenticator) -> wa.Registered:
    options, challenge = wa.registration_options(RP, "denpex", b"user-1", "alice@acme", [])
    return wa.verify_registration(device.create(options, ORIGIN), challenge, RP, ORIGIN)


def test_a_full_ceremony_passes_and_the_counter_moves() -> None:
    device = Authenticator()
    key = registered(device)
    assert key.credential_id and key.public_key and key.sign_count == 0
    options, challenge = wa.authentication_options(RP, [key.credential_id])
    answer = device.get(options, ORIGIN)
    assert wa.credential_id_of(answer) == key.credential_id
    count = wa.verify_authentication(answer, challenge, RP, ORIGIN, key.public_key, 0)
    assert count == 1
    options, challenge = wa.authentication_options(RP, [key.credential_id])
    again = device.get(options, ORIGIN)
    assert wa.verify_authentication(again, challenge, RP, ORIGIN, key.public_key, count) == 2


def test_wrong_challenge_origin_rp_signature_or_counter_are_refused() -> None:
    device = Authenticator()
    key = registered(device)
    options, challenge = wa.registration_options(RP, "denpex", b"user-2", "bob@acme", [])
    created = Authenticator().create(options, ORIGIN)
    with pytest.raises(MfaError):
        wa.verify_registration(created, b"another challenge", RP, ORIGIN)
    with pytest.raises(MfaError):
        wa.verify_registration(created, challenge, RP, "https://evil.test")

    options, challenge = wa.authentication_options(RP, [key.credential_id])
    answer = device.get(options, ORIGIN)
    with pytest.raises(MfaError):
        wa.verify_authentication(answer, b"not this one", RP, ORIGIN, key.public_key, 0)
    with pytest.raises(MfaError):
        wa.verify_authentication(answer, challenge, "other.test", ORIGIN, key.public_key, 0)
    forged = copy.deepcopy(answer)
    signature = bytearray(unb64url(forged["response"]["signature"]))
    signature[-1] ^= 1
    forged["response"]["signature"] = b64url(bytes(signature))
    with pytest.raises(MfaError):
        wa.verify_authentication(forged, challenge, RP, ORIGIN, key.public_key, 0)
    with pytest.raises(MfaError):  # the device says 1; the server has seen 5: a clone
        wa.verify_authentication(answer, challenge, RP, ORIGIN, key.public_key, 5)
    assert wa.verify_authentication(answer, challenge, RP, ORIGIN, key.public_key, 0) == 1
