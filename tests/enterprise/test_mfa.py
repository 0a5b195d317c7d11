"""TOTP and recovery codes as pure functions: RFC 6238's own test vector (SHA-1, 8 digits)
through pyotp, the skew window, a code good once, recovery codes hashed with a salt each."""

from __future__ import annotations

import base64

import pyotp

from denpex.enterprise import mfa


def test_rfc6238_vector_through_pyotp() -> None:
    # RFC 6238 Appendix B: the ASCII key "12345678901234567890", T = 59 s -> 94287082
    secret = base64.b32encode(b"12345678901234567890").decode()
    assert pyotp.TOTP(secret, digits=8, interval=30).at(59) == "94287082"


def test_a_code_is_good_once_and_only_near_its_time() -> None:
    secret = mfa.new_totp_secret()
    now = 1_800_000_000.0
    code = pyotp.TOTP(secret).at(now)
    accepted = mfa.verify_totp(secret, code, last_step=0, now=now)
    assert accepted is not None and accepted.step == int(now // 30)
    assert mfa.verify_totp(secret, code, last_step=accepted.step, now=now) is None  # replay
    assert mfa.verify_totp(secret, code, last_step=0, now=now + 30) is not None  # skew 1 step
    assert mfa.verify_totp(secret, code, last_step=0, now=now + 95) is None
    assert mfa.verify_totp(secret, "12345", last_step=0, now=now) is None
    assert mfa.verify_totp(secret, "abcdef", last_step=0, now=now) is None
    wrong = f"{(int(code) + 1) % 10**6:06d}"
    assert mfa.verify_totp(secret, wrong, last_step=0, now=now) is None
    uri = mfa.provisioning_uri(secret, "alice@acme")
    assert uri.startswith("otpauth://totp/denpex:alice%40acme?") and f"secret={secret}" in uri


def test_recovery_codes_are_hashed_with_a_salt_each() -> None:
    codes = mfa.new_recovery_codes()
    assert len(codes) == 10 and len(set(codes)) == 10
    stored = [mfa.hash_recovery_code(c) for c in codes]
    assert all(codes[0] not in h and codes[0].replace("-", "") not in h for h in stored)
    assert mfa.hash_recovery_code(codes[0]) != stored[0]  # another salt
    assert mfa.recovery_code_matches(codes[0], stored[0])
    assert mfa.recovery_code_matches(" " + codes[0].upper() + " ", stored[0])
    assert not mfa.recovery_code_matches(codes[1], stored[0])
    assert not mfa.recovery_code_matches(codes[0], "zz$00")
