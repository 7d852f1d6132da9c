"""The inbound half of each provider: what the receiver accepts on each webhook path. The
interface (`base`: `InboundProvider`, `WebhookRequest`), the providers served (`registry`),
one module per provider (`whatsapp`, `chatwoot`, and their helpers), what every parser yields
(`parsing`) and request authentication (`signature`). Pure: no I/O."""
