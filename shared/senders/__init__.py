"""Senders: the outbound half of each provider, one module per provider (`whatsapp`,
`chatwoot`), each a subclass of `base.Sender`, how a reply is shaped for a channel
(`formatting`, `split`) and how the sender of each conversation is chosen (`loading`). The
worker's turns and the ops page's replies by hand send through the same senders."""
