"""Local stand-ins for the outside systems: Meta's Graph API, Anthropic's Messages API and
Chatwoot's API, a speech-to-text API, and a team's receiver of the review webhook.

Test infrastructure, used in-process from pytest (`with GraphApiStandIn() as graph: ...`) and as
scripts (`scripts/graph_standin`, `scripts/anthropic_standin`, `scripts/chatwoot_standin`,
`scripts/transcribe_standin`; the dev stack runs them). Each one records every request and takes
injected faults from Python or over HTTP (`POST /_control`).

Names are imported lazily, so `python -m scripts.standins.graph_api` does not load the module
twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scripts.standins._common import RecordedRequest
    from scripts.standins.chatwoot_api import (
        ChatwootApiStandIn,
        ChatwootFault,
        CreatedMessage,
        chatwoot_headers,
        message_created,
        sign_chatwoot,
    )
    from scripts.standins.graph_api import (
        META_ERRORS,
        GraphApiStandIn,
        GraphFault,
        ReadReceipt,
        SentMessage,
        WebhookDelivery,
        meta_error_body,
        sign_body,
        status_webhook,
    )
    from scripts.standins.messages_api import (
        ERROR_TYPES,
        MessagesApiStandIn,
        MessagesFault,
        anthropic_error_body,
        last_user_block,
        last_user_text,
        system_text,
    )
    from scripts.standins.review_hook import ReviewHookStandIn
    from scripts.standins.server import BackgroundServer, free_port
    from scripts.standins.transcribe_api import TranscribeApiStandIn, Transcription

_WHERE = {
    "RecordedRequest": "_common",
    "ChatwootApiStandIn": "chatwoot_api",
    "ChatwootFault": "chatwoot_api",
    "CreatedMessage": "chatwoot_api",
    "chatwoot_headers": "chatwoot_api",
    "message_created": "chatwoot_api",
    "sign_chatwoot": "chatwoot_api",
    "META_ERRORS": "graph_api",
    "GraphApiStandIn": "graph_api",
    "GraphFault": "graph_api",
    "ReadReceipt": "graph_api",
    "SentMessage": "graph_api",
    "WebhookDelivery": "graph_api",
    "meta_error_body": "graph_api",
    "sign_body": "graph_api",
    "status_webhook": "graph_api",
    "ERROR_TYPES": "messages_api",
    "MessagesApiStandIn": "messages_api",
    "MessagesFault": "messages_api",
    "anthropic_error_body": "messages_api",
    "last_user_block": "messages_api",
    "last_user_text": "messages_api",
    "system_text": "messages_api",
    "ReviewHookStandIn": "review_hook",
    "BackgroundServer": "server",
    "free_port": "server",
    "TranscribeApiStandIn": "transcribe_api",
    "Transcription": "transcribe_api",
}

__all__ = [
    "ERROR_TYPES",
    "META_ERRORS",
    "BackgroundServer",
    "ChatwootApiStandIn",
    "ChatwootFault",
    "CreatedMessage",
    "GraphApiStandIn",
    "GraphFault",
    "MessagesApiStandIn",
    "MessagesFault",
    "ReadReceipt",
    "RecordedRequest",
    "ReviewHookStandIn",
    "SentMessage",
    "TranscribeApiStandIn",
    "Transcription",
    "WebhookDelivery",
    "anthropic_error_body",
    "chatwoot_headers",
    "free_port",
    "last_user_block",
    "last_user_text",
    "message_created",
    "meta_error_body",
    "sign_body",
    "sign_chatwoot",
    "status_webhook",
    "system_text",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
