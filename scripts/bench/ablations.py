"""What-if variants of `receiver.app:app`, to measure a change before making it in receiver/.

    scripts/bench_receiver --app ablations:app --app-env VARIANT=fast+gc

`VARIANT` is a `+`-separated list; each piece monkeypatches the receiver at import:

- `gc`: `gc.freeze()` after start-up imports and a gen0 threshold of 50,000 (no collection
  runs under the benchmark; the default thresholds give ~45 gen2 collections of ~15-40 ms each
  per 20 s at 7k req/s, which is where the receiver's p99 comes from);
- `notimeout`: no per-request `asyncio.timeout` around the group-commit wait (the Redis
  client's socket timeout still bounds each round);
- `empty`: answer 200 with an empty body instead of the JSON counts (uvicorn then writes the
  response with one `write()` instead of two);
- `rounds1`, `rounds2`, `rounds3`: at most that many group-commit rounds in flight at once
  (`receiver.store.ROUNDS_IN_FLIGHT`; the receiver as committed uses 1);
- `nextfirst`: send the next group-commit round before the answered requests respond (the
  order before `receiver.store.ANSWER_FIRST`);
- `nospin`: let the loop sleep while a round is at Redis (`receiver.store.SPIN_MAX_S = 0`, the
  receiver before spinning was added);
- `fast`: POST /webhooks/whatsapp handled by a plain ASGI function in front of Starlette (no
  Request object, router, middleware or exception wrappers; the request task suspends while
  Redis works and every resume unwinds through those frames), empty body, same checks
  (413/401/403, 503 on store errors); everything else goes to the Starlette app.

Each variant keeps the receiver's contract (signature checked, 200 only after Redis
confirmed), so the benchmark's probe and inbox check still apply. Written against the
receiver of commit 743fffc; private names it patches may move.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from starlette.responses import Response

import receiver.app as receiver_app
import receiver.store as receiver_store
from receiver.signature import SignatureError
from receiver.store import Saved, StoreUnavailable
from receiver.whatsapp import parse_body

VARIANT = set(os.environ.get("VARIANT", "").split("+")) - {""}
ROUNDS = {f"rounds{n}": n for n in (1, 2, 3)}
UNKNOWN = VARIANT - {"gc", "notimeout", "empty", "fast", "nextfirst", "nospin", *ROUNDS}
if UNKNOWN:
    raise SystemExit(f"ablations: unknown VARIANT piece(s) {sorted(UNKNOWN)}")

for piece in VARIANT & ROUNDS.keys():
    receiver_store.ROUNDS_IN_FLIGHT = ROUNDS[piece]

if "nextfirst" in VARIANT:
    receiver_store.ANSWER_FIRST = False

if "nospin" in VARIANT:
    receiver_store.SPIN_MAX_S = 0

if "empty" in VARIANT:
    _EMPTY = Response(status_code=200)
    receiver_app._counts = lambda stored, duplicates, deadlettered=False: _EMPTY  # type: ignore[assignment]

if "notimeout" in VARIANT:

    async def _save(self: Any, items: Any, deadletter: bytes | None = None) -> Saved:
        if not items and deadletter is None:
            return Saved(0, 0)
        try:
            results = await self._join(items, deadletter)
        except Exception as exc:
            raise StoreUnavailable(f"Redis error: {exc!r}") from exc
        stored = sum(results)
        return Saved(stored, len(results) - stored)

    receiver_store.InboxWriter.save = _save  # type: ignore[method-assign]

starlette_app = receiver_app.create_app()
app: Any = starlette_app

if "fast" in VARIANT:
    _receiver = starlette_app.state.receiver

    def _start(status: int) -> dict[str, Any]:
        return {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", b"0")],
        }

    _BODY = {"type": "http.response.body", "body": b""}

    async def _webhook(scope: Any, receive: Any, send: Any) -> None:
        status = 200
        try:
            limit = _receiver.settings.max_body_bytes
            signature = None
            for name, value in scope["headers"]:
                if name == b"x-hub-signature-256":
                    signature = value.decode("latin-1")
            chunks = []
            size = 0
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # client went away
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    status = 413
                    break
                chunks.append(chunk)
                more = message.get("more_body", False)
            if status == 200:
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                _receiver.signatures.check(body, signature)
                parsed = parse_body(body, time.time_ns() // 1_000_000)
                deadletter = body if parsed.problems else None
                if parsed.items or deadletter is not None:
                    await _receiver.writer.save(parsed.items, deadletter)
        except SignatureError as exc:
            status = exc.status_code
        except Exception:
            status = 503  # StoreUnavailable or anything unexpected: never a 500
        await send(_start(status))
        await send(_BODY)

    async def _fast(scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == "/webhooks/whatsapp"
        ):
            await _webhook(scope, receive, send)
        else:
            await starlette_app(scope, receive, send)

    app = _fast

if "gc" in VARIANT:
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
