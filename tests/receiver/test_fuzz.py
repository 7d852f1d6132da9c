"""Property-based fuzzing: random bodies and headers never produce a 500 or store unsigned data.

Each property runs twice: against the app in-process (the ASGI path) and against uvicorn with
the Procfile's `ReceiverProtocol` over real HTTP, where a webhook POST is served straight from
the protocol (receiver/http_protocol.py); that run checks the direct path took most of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from shared.events import decode
from shared.keys import Keys
from shared.settings import Settings
from tests.receiver.support import URL, counts, running
from tests.receiver.test_http_protocol import serving
from tests.support.helpers import sign

FUZZ = hypothesis_settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Words of the webhook format, so random JSON often takes the parser's deeper paths.
WORDS = [
    "object",
    "whatsapp_business_account",
    "entry",
    "changes",
    "field",
    "messages",
    "value",
    "metadata",
    "phone_number_id",
    "statuses",
    "contacts",
    "profile",
    "name",
    "wa_id",
    "user_id",
    "id",
    "from",
    "from_user_id",
    "timestamp",
    "type",
    "text",
    "body",
    "image",
    "caption",
    "interactive",
    "button_reply",
    "title",
    "context",
    "status",
    "recipient_id",
    "errors",
    "location",
    "reaction",
    "emoji",
]
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(WORDS)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=5),
    max_leaves=40,
)
header_names = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz-0123456789"), min_size=1, max_size=20
)
RESERVED_HEADERS = ("content-length", "transfer-encoding", "host", "x-hub-signature-256")
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80)
headers = st.dictionaries(
    header_names.filter(lambda n: n not in RESERVED_HEADERS),
    header_values,
    max_size=6,
)
signatures = st.none() | st.just("sha256=") | header_values | header_values.map("sha256=".__add__)


@pytest.fixture(params=["asgi", "direct"])
async def client(
    request: pytest.FixtureRequest, settings: Settings, redis: Redis
) -> AsyncIterator[httpx.AsyncClient]:
    if request.param == "asgi":
        async with running(settings) as in_process:
            yield in_process
        return
    async with serving(settings) as served:
        posts: list[httpx.Request] = []

        async def count(sent: httpx.Request) -> None:
            # h11 refuses to send a value with blanks at either end (a server strips them).
            for name, value in list(sent.headers.items()):
                sent.headers[name] = value.strip()
            posts.append(sent)

        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{served.port}", event_hooks={"request": [count]}
        ) as over_http:
            yield over_http
    # A random header can send a request the ASGI way (`Expect`, `Connection: upgrade`): most
    # go the direct way, or this run would not be testing it.
    assert len(served.asgi) < len(posts) / 2, (len(served.asgi), len(posts))


def webhook_like(value: Any) -> dict[str, Any]:
    """A body shaped like a webhook around random parts."""
    return {
        "object": "whatsapp_business_account",
        "entry": [{"changes": [{"field": "messages", "value": value}]}],
    }


@FUZZ
@given(body=st.binary(max_size=3000), extra=headers, signature=signatures)
async def test_unsigned_or_wrongly_signed_never_stores(
    client: httpx.AsyncClient,
    redis: Redis,
    body: bytes,
    extra: dict[str, str],
    signature: str | None,
) -> None:
    if signature is not None:
        extra["X-Hub-Signature-256"] = signature
    response = await client.post(URL, content=body, headers=extra)
    assert response.status_code in (401, 403)
    assert await redis.dbsize() == 0


@FUZZ
@given(body=st.binary(max_size=3000), extra=headers)
async def test_signed_random_bytes_never_500(
    client: httpx.AsyncClient, redis: Redis, body: bytes, extra: dict[str, str]
) -> None:
    extra["X-Hub-Signature-256"] = sign(body)
    response = await client.post(URL, content=body, headers=extra)
    assert response.status_code == 200


@FUZZ
@given(doc=json_values | json_values.map(webhook_like), extra=headers)
async def test_signed_random_json_never_500(
    client: httpx.AsyncClient, redis: Redis, doc: Any, extra: dict[str, str]
) -> None:
    body = orjson.dumps(doc)
    extra["X-Hub-Signature-256"] = sign(body)
    response = await client.post(URL, content=body, headers=extra)
    assert response.status_code == 200
    answer = counts(response)
    assert answer["stored"] >= 0 and answer["duplicates"] >= 0
    async for key in redis.scan_iter(match=Keys().tenant("*").inbox):
        for item in await redis.lrange(key, 0, -1):
            assert decode(item).get("channel", "whatsapp") == "whatsapp"
