"""The inbound providers this receiver serves, one webhook path each.

A new provider is a module with a class like `receiver.providers.chatwoot.ChatwootInbound` (see the
`InboundProvider` protocol in receiver/providers/base.py) and one line here.
"""

from __future__ import annotations

from receiver.providers.base import InboundProvider
from receiver.providers.chatwoot import ChatwootInbound
from receiver.providers.whatsapp import WhatsAppInbound
from shared.settings import Settings


def inbound_providers(settings: Settings) -> dict[str, InboundProvider]:
    """Webhook path -> the provider serving its POSTs."""
    providers: list[InboundProvider] = [
        WhatsAppInbound(settings.whatsapp_app_secrets),
        ChatwootInbound(
            settings.chatwoot_webhook_secrets,
            settings.chatwoot_webhook_tokens,
            only_pending=settings.chatwoot_only_pending,
        ),
    ]
    return {p.path: p for p in providers}
