"""The signature checker and the verification-token comparison."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from receiver.providers.signature import (
    BadSignature,
    MissingSignature,
    SignatureChecker,
    token_matches,
)
from tests.support.helpers import sign

BODY = b'{"object":"whatsapp_business_account","entry":[]}'


def test_valid_signature_passes() -> None:
    SignatureChecker(["s1"]).check(BODY, sign(BODY, "s1"))


def test_any_rotated_secret_passes() -> None:
    checker = SignatureChecker(["new", "old"])
    checker.check(BODY, sign(BODY, "old"))
    checker.check(BODY, sign(BODY, "new"))


def test_uppercase_hex_passes() -> None:
    header = sign(BODY, "s1")
    SignatureChecker(["s1"]).check(BODY, "sha256=" + header.removeprefix("sha256=").upper())


@pytest.mark.parametrize(
    "header",
    [
        sign(BODY, "other"),
        sign(BODY + b" ", "s1"),
        sign(BODY, "s1").replace("sha256=", "sha1="),
        sign(BODY, "s1")[:-2],
        "sha256=",
        "",
        "sha256=zz",
        "sha256=é∂",
    ],
)
def test_wrong_or_malformed_signature_is_refused(header: str) -> None:
    with pytest.raises(BadSignature):
        SignatureChecker(["s1"]).check(BODY, header)


@pytest.mark.parametrize("key_length", [1, 5, 32, 63, 64, 65, 200])
@pytest.mark.parametrize("body", [b"", BODY, bytes(range(256)) * 9])
def test_same_mac_as_the_hmac_module(key_length: int, body: bytes) -> None:
    """The checker computes HMAC-SHA256 from two keyed hash states (RFC 2104) instead of
    `hmac`'s wrapper: it must accept exactly what `hmac.new` signs, keys longer than the
    hash's 64-byte block included (those are hashed first)."""
    secret = ("k\u00e9" * 100)[:key_length]
    checker = SignatureChecker([secret])
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    checker.check(body, f"sha256={expected}")
    wrong = hmac.new((secret + "x").encode(), body, hashlib.sha256).hexdigest()
    with pytest.raises(BadSignature):
        checker.check(body, f"sha256={wrong}")


def test_missing_header_is_401() -> None:
    with pytest.raises(MissingSignature) as info:
        SignatureChecker(["s1"]).check(BODY, None)
    assert info.value.status_code == 401


def test_no_secret_refuses_everything() -> None:
    checker = SignatureChecker(["", ""])
    assert not checker.configured
    with pytest.raises(BadSignature):
        checker.check(BODY, sign(BODY, ""))


@pytest.mark.parametrize(
    ("given", "expected", "ok"),
    [
        ("tok", "tok", True),
        ("tok", "tok2", False),
        ("", "", False),
        (None, "tok", False),
        ("ñ", "ñ", True),
        ("\udcff", "tok", False),
    ],
)
def test_token_matches(given: str | None, expected: str, ok: bool) -> None:
    assert token_matches(given, expected) is ok
