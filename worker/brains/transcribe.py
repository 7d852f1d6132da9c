"""Voice notes as text, through an OpenAI-compatible speech-to-text API.

`POST {TRANSCRIBE_BASE_URL}/audio/transcriptions`, multipart `file` and `model`
(`TRANSCRIBE_MODEL`), bearer `TRANSCRIBE_API_KEY`, answers JSON `{"text": ...}`: OpenAI, Groq and
self-hosted Whisper servers speak it. The file's name carries its format (the APIs read the
extension): WhatsApp's voice notes are `audio/ogg` (Opus).
"""

from __future__ import annotations

import httpx

from shared.settings import Settings

EXTENSIONS = {
    "audio/ogg": "ogg",
    "audio/opus": "opus",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/mp4": "m4a",
    "audio/m4a": "m4a",
    "audio/x-m4a": "m4a",
    "audio/aac": "aac",
    "audio/amr": "amr",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/webm": "webm",
    "audio/flac": "flac",
}


class TranscribeError(Exception):
    """The speech-to-text API did not give a text."""


class Transcriber:
    def __init__(self, settings: Settings, client: httpx.AsyncClient) -> None:
        self._settings = settings
        self._client = client

    async def text(self, data: bytes, mime: str) -> str:
        """The text spoken in `data` (a file of type `mime`)."""
        s = self._settings
        name = f"voice.{EXTENSIONS.get(mime, 'ogg')}"
        headers = (
            {"Authorization": f"Bearer {s.transcribe_api_key}"} if s.transcribe_api_key else {}
        )
        try:
            response = await self._client.post(
                f"{s.transcribe_base_url}/audio/transcriptions",
                files={"file": (name, data, mime or "audio/ogg")},
                data={"model": s.transcribe_model},
                headers=headers,
                follow_redirects=True,  # the client's default is not to (media fetches check each)
            )
        except httpx.HTTPError as exc:
            raise TranscribeError(repr(exc)) from exc
        if response.status_code != 200:
            raise TranscribeError(f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            text = response.json()["text"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TranscribeError(f"no text in the answer: {response.text[:200]}") from exc
        if not isinstance(text, str):
            raise TranscribeError("the answer's text is not a string")
        return text
