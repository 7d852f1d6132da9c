"""A local stand-in for an OpenAI-compatible speech-to-text API, for tests and the dev stack.

    stt = TranscribeApiStandIn(api_keys="stt-key").start()    # or `with` / `async with`
    # point the product at it: TRANSCRIBE_BASE_URL=stt.url + "/v1"
    stt.transcript_for(b"...ogg bytes...", "Hola, ¿tienen turno el sábado?")
    stt.fail_next(1, status=500)
    [t.model for t in stt.transcriptions()]

It serves `POST /v1/audio/transcriptions` as OpenAI documents it: bearer key (401 otherwise),
multipart `file` and `model` (400 when either is missing), answering `{"text": ...}`: the text
registered for the file's bytes, else `default_text` (or, when that is None, a sentence naming the
file's size and name, so a test sees which file was sent). Every request is recorded, with the
file's name, content type, bytes and the model. Faults (an error status, a delay) from Python or
`POST /_control` (`{"op": "fail", "status": 500, "count": 1, "delay": 0}`; `{"op":
"transcript", "data_b64": ..., "text": ...}`).

Run alone: `scripts/transcribe_standin --port 8083 [--key K | --any-key]`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from email.parser import BytesParser
from email.policy import default
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins._common import (
    UNSET,
    ControlOp,
    RecordedRequest,
    StandInBase,
    accepts,
    as_tuple,
    fault_fields,
)
from scripts.standins._script import Credentials, script_parser, serve_forever

__all__ = ["TranscribeApiStandIn", "TranscribeFault", "Transcription"]

PATH = "/v1/audio/transcriptions"


@dataclass
class TranscribeFault:
    """Requests as they arrive, after the key check: after `delay`, HTTP `status` with an
    OpenAI-shaped error (no status: a pure delay, then answered normally)."""

    status: int | None = None
    raw_body: str | None = None
    content_type: str = "text/plain"
    delay: float = 0.0
    count: int | None = 1
    drop: bool = False
    hits: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Transcription:
    """One accepted request: what the product sent, and the text it got."""

    filename: str
    content_type: str
    data: bytes
    model: str
    text: str


class TranscribeApiStandIn(StandInBase[TranscribeFault]):
    """`api_keys`: accepted bearer keys (None: any non-empty one); `default_text`: the text of a
    file with no registered transcript (None: a sentence naming it)."""

    name = "transcribe-standin"

    def __init__(
        self,
        *,
        api_keys: str | Iterable[str] | None = ("stt-key",),
        default_text: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.api_keys: tuple[str, ...] | None = ()
        self.default_text: str | None = None
        self._texts: dict[str, str] = {}  # sha256 of the file -> its transcript
        self._initial_config = {"api_keys": api_keys, "default_text": default_text}
        self.configure(**self._initial_config)
        self._app = self._serve([Route(PATH, self._transcribe, methods=["POST"])])

    def configure(
        self,
        *,
        api_keys: str | Iterable[str] | None = UNSET,
        default_text: str | None = UNSET,
    ) -> None:
        with self._lock:
            if api_keys is not UNSET:
                self.api_keys = as_tuple(api_keys)
            if default_text is not UNSET:
                self.default_text = default_text

    def transcript_for(self, data: bytes, text: str) -> None:
        """What a file of exactly these bytes says."""
        with self._lock:
            self._texts[hashlib.sha256(data).hexdigest()] = text

    def reset(self) -> None:
        super().reset()
        with self._lock:
            self._texts.clear()

    def fail_next(self, n: int = 1, *, status: int = 500, delay: float = 0.0) -> TranscribeFault:
        return self.add_fault(TranscribeFault(status=status, delay=delay, count=n))

    def hang_next(self, n: int, seconds: float) -> TranscribeFault:
        return self.add_fault(TranscribeFault(delay=seconds, count=n))

    def transcriptions(self) -> list[Transcription]:
        """The accepted requests, oldest first."""
        with self._lock:
            return [r.extra["done"] for r in self._records if r.ok and "done" in r.extra]

    # ------------------------------------------------------------------ HTTP control

    def _control_ops(self) -> dict[str, ControlOp]:
        """Besides every stand-in's ops: `fail` (fields of `TranscribeFault`) and
        `transcript` (`data_b64`, `text`)."""
        return {
            **super()._control_ops(),
            "fail": lambda p: self.add_fault(TranscribeFault(**fault_fields(TranscribeFault, p))),
            "transcript": lambda p: self.transcript_for(
                base64.b64decode(str(p["data_b64"])), str(p["text"])
            ),
        }

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "api_keys": list(self.api_keys) if self.api_keys is not None else None,
                "default_text": self.default_text,
                "transcripts": len(self._texts),
                **self._fault_state(),
            }

    # ------------------------------------------------------------------ the API

    def _stale(self, record: RecordedRequest) -> Response:
        return self._answer(record, 503, _error("The stand-in was reset meanwhile.", "server"))

    def _fault_answer(self, record: RecordedRequest, fault: TranscribeFault) -> Response | None:
        if fault.raw_body is not None:
            return self._raw_answer(record, fault)
        if fault.status is None:
            return None
        return self._answer(record, fault.status, _error("Injected fault.", "server_error"))

    async def _unknown_path(self, request: Request) -> Response:
        record = await self._receive(request, kind="invalid")
        body = _error(f"Invalid URL ({request.method} {request.url.path})", "invalid_request_error")
        return self._answer(record, 404, body)

    async def _transcribe(self, request: Request) -> Response:
        record = await self._receive(request, kind="transcription")
        if not await self._delay(record, self.latency):
            return self._stale(record)
        header = request.headers.get("authorization") or ""
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        if not accepts(self.api_keys, key):
            return self._answer(
                record, 401, _error("Incorrect API key provided.", "invalid_request_error")
            )
        injected = await self._injected(record, self._take_fault(lambda f: True))
        if injected is not None:
            return injected
        fields = _multipart(request.headers.get("content-type", ""), record.raw)
        upload, model = fields.get("file"), fields.get("model")
        if upload is None or model is None or not model[2]:
            body = _error("file and model are required (multipart/form-data)", "invalid_request")
            return self._answer(record, 400, body)
        name, content_type, data = upload
        with self._lock:
            text = self._texts.get(hashlib.sha256(data).hexdigest(), self.default_text)
        if text is None:
            text = f"(a recording of {len(data)} bytes, {name})"
        record.extra["done"] = Transcription(
            filename=name, content_type=content_type, data=data, model=model[2].decode(), text=text
        )
        return self._answer(record, 200, {"text": text})


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str, str, bytes]]:
    """{field: (filename, content type, bytes)} of a multipart/form-data body (the stdlib's
    MIME parser: the stand-in needs no multipart package)."""
    if not content_type.lower().startswith("multipart/form-data"):
        return {}
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=default).parsebytes(head + body)
    fields: dict[str, tuple[str, str, bytes]] = {}
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = (part.get_filename() or "", part.get_content_type(), payload)
    return fields


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# ---------------------------------------------------------------------- script


KEYS = Credentials("--key", "--any-key", "bearer key", "TRANSCRIBE_API_KEY", "stt-key")


def main(argv: Sequence[str] | None = None) -> None:
    parser = script_parser(
        "transcribe_standin",
        "Local stand-in for an OpenAI-compatible speech-to-text API.",
        "TRANSCRIBE_STANDIN_PORT",
        8083,
        KEYS,
    )
    parser.add_argument("--text", help="the transcript of every file (default: names the file)")
    args = parser.parse_args(argv)
    standin = TranscribeApiStandIn(api_keys=KEYS.accepted(args), default_text=args.text)
    serve_forever(standin, args, "speech-to-text stand-in", "POST /_control to inject faults")


if __name__ == "__main__":
    main()
