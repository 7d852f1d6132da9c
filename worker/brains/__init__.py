"""Brains: what answers a batch. The loading of the configured brain (`loading`), the Claude
brain (`anthropic_brain`), its prompt (`prompt`), the files it is shown (`media`,
`transcribe`), tools, the AI's errors (`ai_errors`) and the fleet-wide pause while the AI is
down (`ai_pause`)."""
