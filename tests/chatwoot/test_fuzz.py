"""Property-based fuzzing of the Chatwoot route: random bodies, headers and queries never
produce a 500, never raise in the parser, and nothing unauthenticated is ever stored."""

from __future__ import annotations

import time
from typing import Any

import orjson
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from receiver.providers.chatwoot import parse_body
from scripts.standins import chatwoot_headers, message_created
from shared.settings import Settings
from tests.receiver.support import running

FUZZ = hypothesis_settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SECRET = "fuzz-secret"
WORDS = [
    "event",
    "message_created",
    "id",
    "content",
    "message_type",
    "incoming",
    "outgoing",
    "private",
    "account",
    "inbox",
    "conversation",
    "inbox_id",
    "status",
    "pending",
    "attachments",
    "file_type",
    "content_attributes",
    "in_reply_to",
    "created_at",
    "sender",
    "name",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(WORDS)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


def _mutated(base: dict[str, Any], changes: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps({**base, **changes})
    except (orjson.JSONEncodeError, TypeError):
        return b"{}"


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(WORDS), JSON, max_size=6))
def test_the_parser_never_raises_on_mutated_webhooks(changes: dict[str, Any]) -> None:
    base = message_created(message_id=1, content="hola", conversation=42)
    parsed = parse_body(_mutated(base, changes), 1_764_500_000_000)
    for tenant, items in parsed.items.items():
        assert tenant.startswith("cw-") and "{" not in tenant
        assert all(dedupe.startswith("chatwoot:") for dedupe, _ in items)


@FUZZ
@given(
    raw=st.binary(max_size=300) | JSON.map(lambda v: orjson.dumps(v, default=str)),
    headers=st.dictionaries(
        st.sampled_from(["X-Chatwoot-Signature", "X-Chatwoot-Timestamp", "X-Chatwoot-Delivery"]),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=400),
        max_size=3,
    ),
    query=st.sampled_from(["", "?token=", "?token=x", "?token=%FF%FE", "?a=1&token"]),
)
async def test_unauthenticated_garbage_is_refused_and_never_a_500(
    settings: Settings, redis: Redis, raw: bytes, headers: dict[str, str], query: str
) -> None:
    cw = settings.with_overrides(chatwoot_webhook_secrets=(SECRET,), chatwoot_webhook_tokens=("t",))
    async with running(cw) as client:
        response = await client.post(f"/webhooks/chatwoot{query}", content=raw, headers=headers)
    assert response.status_code in (401, 403), response.status_code
    assert await redis.dbsize() == 0


@FUZZ
@given(raw=st.binary(max_size=300) | JSON.map(lambda v: orjson.dumps(v, default=str)))
async def test_signed_garbage_is_answered_200_and_kept_or_ignored(
    settings: Settings, redis: Redis, raw: bytes
) -> None:
    await redis.flushall()
    cw = settings.with_overrides(chatwoot_webhook_secrets=(SECRET,))
    async with running(cw) as client:
        response = await client.post(
            "/webhooks/chatwoot",
            content=raw,
            headers=chatwoot_headers(raw, SECRET, timestamp=int(time.time())),
        )
    assert response.status_code == 200, response.text
