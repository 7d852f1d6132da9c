"""Unique, correctly signed Meta WhatsApp webhook bodies for the receiver benchmark.

wrk's LuaJIT cannot compute HMACs, so the bodies and their signatures are generated here, one
file per wrk thread, one request per line: `<hex HMAC-SHA256(secret, body)> TAB <body> LF`.
A body is compact JSON (no raw newline or tab can occur in it), shaped like
tests/fixtures/whatsapp/text.json: one entry, one change, `messages_per_request` text messages
from people of one tenant (a few tenants rotate).
Every message has its own wamid, built from a per-file nonce and the record number, so no two
messages of one file (or of two files with different nonces) share a provider id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (phone_number_id = tenant, display number, WABA id)
TENANTS = [
    ("106500000000001", "15550001001", "102200000000001"),
    ("106500000000002", "15550001002", "102200000000002"),
    ("106500000000003", "15550001003", "102200000000003"),
    ("106500000000004", "15550001004", "102200000000004"),
]
PEOPLE_PER_TENANT = 50
NAMES = [
    "Ana Pérez",
    "Bruno Díaz",
    "Carla Gómez",
    "Diego Fernández",
    "Elena Ruiz",
    "Facundo Sosa",
    "Gabriela Núñez",
    "Hernán López",
]
TEXTS = [
    "hola",
    "una consulta",
    "¿tienen turno el sábado?",
    "a la tarde",
    "gracias!",
    "¿cuánto sale el corte?",
    "perfecto, nos vemos",
    "¿aceptan tarjeta?",
    "estoy llegando 10 min tarde, perdón",
]


@dataclass
class PayloadFile:
    """`threads` files `<prefix>.<n>`, each with `per_thread` requests (one per line).

    Request number r (0-based, over all files) is line r % per_thread of file r // per_thread.
    """

    prefix: Path
    per_thread: int
    threads: int
    messages_per_request: int
    nonce: str
    tenants: list[str] = field(default_factory=lambda: [t[0] for t in TENANTS])

    @property
    def count(self) -> int:
        return self.per_thread * self.threads

    def message_ids(self, record: int) -> list[str]:
        """The wamids carried by request number `record`."""
        return [wamid(self.nonce, record, j) for j in range(self.messages_per_request)]

    def remove(self) -> None:
        for n in range(self.threads):
            Path(f"{self.prefix}.{n}").unlink(missing_ok=True)


def wamid(nonce: str, record: int, j: int) -> str:
    raw = f"{nonce}.{record:09d}.{j:04d}".encode()
    return "wamid.HBgN" + base64.b64encode(raw).decode()


def sign(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def body_for(record: int, nonce: str, messages_per_request: int, now: int) -> bytes:
    tenant, display, waba = TENANTS[record % len(TENANTS)]
    contacts: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for j in range(messages_per_request):
        n = (record * 7 + j * 13) % PEOPLE_PER_TENANT
        wa_id = f"54911555{n:05d}"
        if not any(c["wa_id"] == wa_id for c in contacts):
            contacts.append({"profile": {"name": NAMES[n % len(NAMES)]}, "wa_id": wa_id})
        messages.append(
            {
                "from": wa_id,
                "id": wamid(nonce, record, j),
                "timestamp": str(now - 2 + j),
                "type": "text",
                "text": {"body": TEXTS[(record + j) % len(TEXTS)]},
            }
        )
    payload = {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": waba,
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": display,
                                "phone_number_id": tenant,
                            },
                            "contacts": contacts,
                            "messages": messages,
                        },
                    }
                ],
            }
        ],
    }
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def generate(
    prefix: Path,
    per_thread: int,
    threads: int,
    secret: str,
    messages_per_request: int = 1,
    nonce: str | None = None,
) -> PayloadFile:
    """Write `threads` files of `per_thread` signed requests each and describe them."""
    nonce = nonce or f"b{time.time_ns():x}"
    key = secret.encode()
    now = int(time.time())
    for n in range(threads):
        with open(f"{prefix}.{n}", "wb") as out:
            for record in range(n * per_thread, (n + 1) * per_thread):
                body = body_for(record, nonce, messages_per_request, now)
                out.write(sign(key, body).encode() + b"\t" + body + b"\n")
    return PayloadFile(prefix, per_thread, threads, messages_per_request, nonce)


if __name__ == "__main__":  # handy for eyeballing: python -m scripts.bench.payloads
    print(body_for(0, "demo", 1, int(time.time())).decode())
