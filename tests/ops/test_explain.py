"""Review item errors as sentences (receiver/ops/explain.py): each shape the worker stores,
and what anything else gets (itself, shortened, without markup)."""

from __future__ import annotations

import pytest

from receiver.ops.explain import deliveries, raw_differs, sentence


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (
            "RetryLater: HTTP 500, code None: <html>oops</html>",
            "WhatsApp answered 500 (server error) with an HTML page instead of an error message.",
        ),
        (
            "RetryLater: HTTP 400, code 131026: Message undeliverable",
            "WhatsApp answered 400 (bad request), error 131026 (message undeliverable: not on "
            "WhatsApp, an old app, or it cannot be received): Message undeliverable.",
        ),
        (
            "131047: Re-engagement message",
            "WhatsApp refused it: error 131047 (the 24-hour window had closed: only a template "
            "may be sent): Re-engagement message.",
        ),
        ("RetryLater: Chatwoot HTTP 502: ", "Chatwoot answered 502 (bad gateway)."),
        (
            "RetryLater: Graph API unreachable: ConnectError('refused')",
            "WhatsApp could not be reached (ConnectError); nothing was sent.",
        ),
        (
            "oldest message 7200s old",
            "The oldest message had waited 2h00m (longer than REVIEW_AFTER_S) when a worker "
            "got to it: too late to answer without a person looking first.",
        ),
        (
            "RetryLater: Anthropic: APIStatusError(529)",
            "The AI (Anthropic) failed: APIStatusError(529).",
        ),
        ("something <b>new</b>", "something new"),
        ("", ""),
        (None, ""),
    ],
)
def test_errors_read_as_sentences(raw: str | None, said: str) -> None:
    assert sentence(raw) == said


def test_a_long_unknown_error_is_shortened_and_the_raw_is_offered() -> None:
    raw = "x" * 1000
    assert len(sentence(raw)) == 240 and sentence(raw).endswith("…")
    assert raw_differs(raw) and not raw_differs("plain words") and not raw_differs("")


def test_a_late_failure_says_which_part_was_not_delivered() -> None:
    item = {
        "reason": "undeliverable",
        "late_failure": {
            "parts": [{"part": 1, "code": 131026, "title": "", "details": "", "text": "B"}],
            "template": "reengage",
        },
    }
    assert deliveries(item) == [
        {
            "state": "not delivered",
            "what": "part 2: Meta reported error 131026 (message undeliverable: not on WhatsApp, "
            "an old app, or it cannot be received)",
            "text": "B",
        },
        {"state": "sent", "what": "template reengage in its place", "text": ""},
    ]
