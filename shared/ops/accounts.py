"""The ops page's accounts: one per operator, so the audit names who did what.

`OPS_USERS` lists them, comma-separated, each `name:credential`. A credential is never the
secret itself, only what checks it:

    scrypt$<n>$<r>$<p>$<salt>$<hash>    a password, hashed with scrypt (a memory-hard hash:
                                         a stolen config costs an attacker ~16 MB and ~50 ms
                                         of work per guess)
    sha256$<hex>                         a per-person token (43 random url-safe characters,
                                         256 bits): beyond guessing, so one fast hash is enough

Make an entry with `python -m shared.ops.accounts password Ana` (asks for the password) or
`python -m shared.ops.accounts token Ana` (prints a new token once, and the entry). The
standard library's `hashlib.scrypt` rather than a package: it is OpenSSL's, releases the GIL
while it works (the receiver checks a password in a thread, never on the event loop that
answers webhooks), and its parameters travel inside the credential, so they can be raised
later without breaking older entries.

A name is what the audit log records: printable, at most 64 characters, no `:` or `,`, unique
without regard to case ("Ana" and "ana" are one account).
"""

from __future__ import annotations

import argparse
import base64
import getpass
import hashlib
import hmac
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NAME_MAX = 64
# OWASP's floor for scrypt (2**17 would be its first choice; 2**14 keeps a sign-in near 50 ms
# on a small dyno, and the sign-in back-off already limits guesses online).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_SCRYPT_MAXMEM = 64 * 1024 * 1024
_TOKEN_BYTES = 32


class AccountsError(ValueError):
    """`OPS_USERS` (or one entry of it) that cannot be read; the message says why."""


@dataclass(frozen=True)
class Account:
    name: str
    credential: str  # `scrypt$…` or `sha256$…`, as OPS_USERS gives it

    def verify(self, secret: str) -> bool:
        """Whether `secret` is this account's password or token (constant time in its
        comparison; an unreadable credential never matches)."""
        return verify_credential(self.credential, secret)

    @property
    def slow(self) -> bool:
        """Checking it costs real CPU (scrypt): the receiver runs it in a thread."""
        return self.credential.startswith("scrypt$")


def clean_name(raw: str) -> str | None:
    """The name as the audit log keeps it (spaces collapsed), or None when it is unusable."""
    name = " ".join(raw.split())
    if not name or len(name) > NAME_MAX or not name.isprintable():
        return None
    return name


def parse_accounts(value: str) -> Mapping[str, Account]:
    """The accounts of an `OPS_USERS` value, by casefolded name ({} for "")."""
    found: dict[str, Account] = {}
    for number, entry in enumerate((e.strip() for e in value.split(",")), start=1):
        if not entry:
            continue
        name_part, sep, credential = entry.partition(":")
        name = clean_name(name_part)
        if not sep or name is None:
            raise AccountsError(
                f"entry {number} is not `name:credential` with a printable name of at most"
                f" {NAME_MAX} characters"
            )
        problem = credential_problem(credential.strip())
        if problem:
            raise AccountsError(f"{name!r}: {problem}")
        key = name.casefold()
        if key in found:
            raise AccountsError(f"{name!r} is listed twice (names are compared without case)")
        found[key] = Account(name, credential.strip())
    return found


def accounts_problem(value: str) -> str:
    """What is wrong with an `OPS_USERS` value ("" when nothing is)."""
    try:
        parse_accounts(value)
    except AccountsError as error:
        return str(error)
    return ""


def credential_problem(credential: str) -> str:
    """What is wrong with one credential ("" when it can be checked)."""
    kind, _, rest = credential.partition("$")
    if kind == "sha256":
        if len(rest) != 64 or not _is_hex(rest):
            return "a sha256 credential is `sha256$` and 64 hex digits"
        return ""
    if kind == "scrypt":
        parts = rest.split("$")
        if len(parts) != 5 or not all(p.isdigit() for p in parts[:3]):
            return "a scrypt credential is `scrypt$n$r$p$salt$hash`"
        n, r, p = (int(x) for x in parts[:3])
        if n < 2**10 or n & (n - 1) or not 1 <= r <= 32 or not 1 <= p <= 16:
            return "scrypt's n must be a power of two >= 1024, r 1..32, p 1..16"
        if 128 * r * n > _SCRYPT_MAXMEM:
            return f"scrypt's n and r would need more than {_SCRYPT_MAXMEM >> 20} MB"
        try:
            salt, digest = _unb64(parts[3]), _unb64(parts[4])
        except ValueError:
            return "the salt and hash of a scrypt credential are url-safe base64"
        if len(salt) < 16 or len(digest) < 32:
            return "a scrypt credential needs a salt of 16 bytes and a hash of 32 at least"
        return ""
    return "a credential starts with `scrypt$` (a password) or `sha256$` (a token);" + (
        " make one with `python -m shared.ops.accounts password NAME`"
    )


def verify_credential(credential: str, secret: str) -> bool:
    kind, _, rest = credential.partition("$")
    given = secret.encode()
    if kind == "sha256":
        return hmac.compare_digest(hashlib.sha256(given).hexdigest(), rest.lower())
    if kind == "scrypt" and not credential_problem(credential):
        n, r, p, salt, digest = rest.split("$")
        expected = _unb64(digest)
        found = hashlib.scrypt(
            given,
            salt=_unb64(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            maxmem=_SCRYPT_MAXMEM,
            dklen=len(expected),
        )
        return hmac.compare_digest(found, expected)
    return False


def password_credential(password: str) -> str:
    """A new scrypt credential for `password` (a fresh salt each time)."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=_SCRYPT_MAXMEM
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def new_token() -> tuple[str, str]:
    """A new per-person token and its credential."""
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    return token, f"sha256${hashlib.sha256(token.encode()).hexdigest()}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text or not all(c.isalnum() or c in "-_" for c in text):
        raise ValueError("not url-safe base64")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


PASSWORD_MIN_CHARS = 12


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.ops.accounts",
        description="Make an entry of OPS_USERS: one account of the ops page.",
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    password = sub.add_parser("password", help="an account signed in with a password")
    password.add_argument("name")
    password.add_argument(
        "--stdin", action="store_true", help="read the password from standard input"
    )
    token = sub.add_parser("token", help="an account signed in with a new random token")
    token.add_argument("name")
    args = parser.parse_args(argv)
    name = clean_name(args.name)
    if name is None or ":" in name or "," in name:
        parser.error(f"a name is printable, at most {NAME_MAX} characters, without ':' or ','")
    if args.kind == "token":
        secret, credential = new_token()
        print(f"token (give it to {name}; it is shown only now): {secret}", file=sys.stderr)
    else:
        secret = sys.stdin.readline().rstrip("\n") if args.stdin else getpass.getpass()
        if len(secret) < PASSWORD_MIN_CHARS:
            parser.error(f"a password has at least {PASSWORD_MIN_CHARS} characters")
        credential = password_credential(secret)
    print(f"{name}:{credential}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
