"""The PKCS#11 KMS against a real SoftHSM2 token the test makes: the key-encryption key is a
token object that cannot be read out, rotation adds a version on the token (seen by another
process), a wrong PIN or a malformed URI is refused without echoing the PIN, and the URI is
RFC 7512's. The envelope contract itself runs in test_kms.py (the `pkcs11` parameter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from denpex.enterprise import envelope
from denpex.enterprise.kms import KmsError, open_kms
from denpex.enterprise.kms_pkcs11 import Pkcs11Kms, parse_uri
from tests.enterprise.softhsm import USER_PIN, Token, make_token

CONTEXT = {"tenant": "red", "name": "idp-secret"}

INSPECT = """
import sys, pkcs11
from pkcs11 import Attribute, ObjectClass
module, token, pin, prefix = sys.argv[1:5]
with pkcs11.lib(module).get_token(token_label=token).open(user_pin=pin) as session:
    keys = [k for k in session.get_objects({Attribute.CLASS: ObjectClass.SECRET_KEY})
            if (k.label or "").startswith(prefix)]
    print(",".join(sorted(k.label for k in keys)))
    for key in keys:
        try:
            key[Attribute.VALUE]
            print("READABLE")
        except pkcs11.exceptions.AttributeSensitive:
            print("sensitive")
"""


@pytest.fixture(scope="module")
def token(tmp_path_factory) -> Token:
    return make_token(tmp_path_factory.mktemp("softhsm"))


def inspect(token: Token, prefix: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", INSPECT, token.module, token.label, USER_PIN, prefix],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SOFTHSM2_CONF": str(token.conf)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_kek_lives_on_the_token_unreadable_and_rotation_adds_a_version(token):
    label = f"kek-{os.urandom(3).hex()}"
    kms = open_kms(token.uri(label))
    assert isinstance(kms, Pkcs11Kms)
    sealed = envelope.seal(kms, b"client-secret-value", CONTEXT)
    assert envelope.key_ref(sealed) == "v1"
    assert kms.rotate() == "v2"
    seen = inspect(token, label)
    assert seen[0] == f"{label}.v1,{label}.v2"
    assert seen[1:] == ["sensitive", "sensitive"]  # C_GetAttributeValue(CKA_VALUE) refused
    again = Pkcs11Kms(token.uri(label))  # another opener of the token finds both versions
    assert envelope.open_sealed(again, sealed, CONTEXT) == b"client-secret-value"
    assert envelope.key_ref(envelope.rewrap(again, sealed, CONTEXT)) == "v2"


def test_a_wrong_pin_is_refused_without_showing_it(token, tmp_path):
    bad = tmp_path / "bad-pin"
    bad.write_text("9999-wrong-pin\n")
    uri = token.uri("kek-pin").replace(str(token.pin_file), str(bad))
    script = (
        "import sys\nfrom denpex.enterprise.kms import open_kms, KmsError\n"
        "try:\n    open_kms(sys.argv[1])\nexcept KmsError as e:\n    print(e)\n"
    )
    out = subprocess.run(  # a fresh process: no session of this token is logged in yet
        [sys.executable, "-c", script, uri],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SOFTHSM2_CONF": str(token.conf)},
    )
    assert f"cannot open token '{token.label}' (PinIncorrect)" in out.stdout, out.stderr
    assert "9999" not in out.stdout + out.stderr
    open_kms(token.uri("kek-pin"))  # this process logs in with the right PIN
    with pytest.raises(KmsError, match="wrong PIN") as refused:
        open_kms(uri)
    assert "9999" not in str(refused.value)


def test_uri_attributes_and_what_is_missing():
    attrs = parse_uri("pkcs11:token=My%20HSM;object=kek?module-path=/lib/p11.so&pin-source=file:/p")
    assert attrs == {
        "token": "My HSM",
        "object": "kek",
        "module-path": "/lib/p11.so",
        "pin-source": "file:/p",
    }
    with pytest.raises(KmsError, match="module-path= is missing"):
        parse_uri("pkcs11:token=t;object=k")
    with pytest.raises(KmsError, match="no value"):
        parse_uri("pkcs11:token;object=k?module-path=/x")
    with pytest.raises(KmsError, match="cannot load module /nonexistent/p11"):
        Pkcs11Kms("pkcs11:token=t;object=k?module-path=/nonexistent/p11.so&pin-value=1")


STARTUP = """
import sys, threading
from denpex.control.server import Runtime, ServerOptions
from denpex.enterprise import kms_pkcs11
from denpex.enterprise.kms import KmsError
url, uri = sys.argv[1:3]
try:
    runtime = Runtime(ServerOptions(url=url, kms_url=uri))
except KmsError as e:
    print("refused:", e)
else:
    print("sessions:", len(kms_pkcs11._SESSIONS), "threads:", threading.active_count())
"""


def test_the_server_logs_in_to_its_token_at_start_up(token, tmp_path):
    """kms_pkcs11.open_token at start-up: a wrong PIN stops the start."""
    bad = tmp_path / "bad-pin"
    bad.write_text("9999-wrong-pin\n")
    env = {**os.environ, "SOFTHSM2_CONF": str(token.conf)}
    outputs = []
    for uri in (
        token.uri("kek-start"),
        token.uri("kek-start").replace(str(token.pin_file), str(bad)),
    ):
        out = subprocess.run(
            [sys.executable, "-c", STARTUP, f"sqlite:///{tmp_path / 'control.db'}", uri],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        outputs.append(out.stdout.strip())
    assert outputs[0] == "sessions: 1 threads: 1"  # no secret was used: logged in all the same
    assert outputs[1] == f"refused: PKCS#11: cannot open token '{token.label}' (PinIncorrect)"


# A library loaded with RTLD_GLOBAL that exports OpenSSL's names, as TensorFlow's
# libtensorflow_framework.so.2 exports BoringSSL's: without isolation, SoftHSM2's C_Login
# called this EVP_DigestFinal_ex instead of its own libcrypto's and crashed.
HIJACKER = r"""
#include <stdlib.h>
int EVP_DigestFinal_ex(void *ctx, unsigned char *md, unsigned int *size) { abort(); }
"""

HIJACKED_LOGIN = """
import ctypes, hashlib, os, ssl, sys  # libcrypto first, its names bound now, as in any process
ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_GLOBAL)
from denpex.enterprise.kms_pkcs11 import open_token
open_token(sys.argv[2])
print("logged in")
"""


def test_the_module_keeps_its_own_crypto_library_when_another_exports_its_names(token, tmp_path):
    source = tmp_path / "hijack.c"
    source.write_text(HIJACKER)
    library = tmp_path / "libhijack.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    out = subprocess.run(
        [sys.executable, "-c", HIJACKED_LOGIN, str(library), token.uri("kek-hijack")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SOFTHSM2_CONF": str(token.conf)},
    )
    assert (out.returncode, out.stdout.strip()) == (0, "logged in"), out.stderr
