"""shared/ops/review_webhook.py: the event a receiver gets for a review item, and the signature it
checks (docs/operating.md#being-told). What each bad delivery gets from `verify`: False."""

from __future__ import annotations

import hashlib
import hmac

import orjson

from shared.ops import review_webhook

TENANT = "106540352242922"
ITEM = {
    "id": "b-1",
    "tenant": TENANT,
    "person": "5491155550001",
    "reason": "too_old",
    "error": "oldest message 1900s old",
    "attempts": 0,
    "reviewed_ms": 1764635999800,
    "messages": [{"id": "wamid.1", "text": "x" * 300}, {"id": "wamid.2", "text": "dos"}],
    "hand_over": "done",
}


def test_the_event_names_the_item_and_previews_its_first_message() -> None:
    event = review_webhook.event(TENANT, ITEM, 1764635999812)
    assert event == {
        "id": f"{TENANT}:b-1",
        "type": "review_item.created",
        "tenant": TENANT,
        "item": {
            "id": "b-1",
            "person": "5491155550001",
            "reason": "too_old",
            "error": "oldest message 1900s old",
            "attempts": 0,
            "reviewed_ms": 1764635999800,
            "messages": 2,
            "preview": "x" * review_webhook.PREVIEW_CHARS,
        },
        "at_ms": 1764635999812,
    }


def test_an_item_without_messages_has_an_empty_preview() -> None:
    item = {**ITEM, "messages": []}
    event = review_webhook.event(TENANT, item, 1)["item"]
    assert event["messages"] == 0 and event["preview"] == ""
    bare = review_webhook.event(TENANT, {"id": "x"}, 1)["item"]  # fields missing: defaults
    assert bare["messages"] == 0 and bare["preview"] == "" and bare["reason"] == ""


def test_the_signature_is_the_documented_hmac_and_verifies() -> None:
    body = review_webhook.body_of(review_webhook.event(TENANT, ITEM, 1))
    headers = review_webhook.headers("s3cret", 1764636000, body)
    expected = hmac.new(b"s3cret", b"1764636000." + body, hashlib.sha256).hexdigest()
    assert headers == {
        "Content-Type": "application/json",
        "X-Review-Timestamp": "1764636000",
        "X-Review-Signature": f"sha256={expected}",
    }
    assert orjson.loads(body)["id"] == f"{TENANT}:b-1"
    sig = headers["X-Review-Signature"]
    assert review_webhook.verify("s3cret", "1764636000", body, sig, now_s=1764636100)


def test_what_verify_refuses() -> None:
    body = b'{"id":"x"}'
    sig = review_webhook.signature("s3cret", "1764636000", body)
    now = 1764636000.0
    assert not review_webhook.verify("other", "1764636000", body, sig, now)  # wrong secret
    assert not review_webhook.verify("s3cret", "1764636000", body + b" ", sig, now)  # body
    assert not review_webhook.verify("s3cret", "1764636001", body, sig, now)  # timestamp
    assert not review_webhook.verify("s3cret", "1764636000", body, sig, now + 301)  # stale
    assert not review_webhook.verify("s3cret", "soon", body, sig, now)  # not a number
    assert not review_webhook.verify("s3cret", "1764636000", body, sig[7:], now)  # no prefix
    assert review_webhook.verify("s3cret", "1764636000", body, sig, now - 299)
