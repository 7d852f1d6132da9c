"""A local stand-in for a team's receiver of the review webhook (docs/operating.md#being-told).

    hook = ReviewHookStandIn(secret="s3cret").start()     # or `with` / `async with`
    # point the workers at it: REVIEW_WEBHOOK_URL=hook.url + PATH, REVIEW_WEBHOOK_SECRET=s3cret
    hook.fail_next(2, status=500)                # then 200 again
    hook.fail_next(1, status=429, retry_after="2")
    hook.hang_next(1, 60)                         # hold a request (a worker killed mid-POST)
    [e["item"]["reason"] for e in hook.events()]

It serves `POST /hooks/review` as a receiver should: it checks `X-Review-Signature` over
`X-Review-Timestamp` and the raw body with its `secret` (shared/ops/review_webhook.py `verify`;
401 when it does not match or the timestamp is stale), then answers 200 `{"ok": true}`. Every
request is recorded with the two headers and `verified`. Faults (an error status, with a
`Retry-After`; a delay) from Python or `POST /_control` (`{"op": "fail", "status": 500,
"count": 1, "retry_after": "2"}`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scripts.standins._common import UNSET, ControlOp, RecordedRequest, StandInBase, fault_fields
from shared.ops import review_webhook

__all__ = ["PATH", "HookFault", "ReviewHookStandIn"]

PATH = "/hooks/review"
_HEADERS = ("content-type", "user-agent", "x-review-signature", "x-review-timestamp")


@dataclass
class HookFault:
    """Requests as they arrive, before the signature check: after `delay`, HTTP `status`
    (with `Retry-After: <retry_after>` when given; no status: a pure delay, then answered
    normally)."""

    status: int | None = None
    retry_after: str | None = None
    raw_body: str | None = None
    content_type: str = "text/plain"
    delay: float = 0.0
    count: int | None = 1
    drop: bool = False
    hits: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ReviewHookStandIn(StandInBase[HookFault]):
    """`secret`: the key signatures are checked with (None: any signature is taken)."""

    name = "review-hook-standin"

    def __init__(
        self, *, secret: str | None = "review-secret", host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host=host, port=port)
        self.secret: str | None = None
        self._initial_config = {"secret": secret}
        self.configure(**self._initial_config)
        self._app = self._serve([Route(PATH, self._hook, methods=["POST"])])

    def configure(self, *, secret: str | None = UNSET) -> None:
        with self._lock:
            if secret is not UNSET:
                self.secret = secret

    def fail_next(
        self, n: int = 1, *, status: int = 500, retry_after: str | None = None
    ) -> HookFault:
        return self.add_fault(HookFault(status=status, retry_after=retry_after, count=n))

    def hang_next(self, n: int, seconds: float) -> HookFault:
        return self.add_fault(HookFault(delay=seconds, count=n))

    def events(self) -> list[dict[str, Any]]:
        """The events taken (answered 200), oldest first."""
        with self._lock:
            return [r.body for r in self._records if r.ok]

    # ------------------------------------------------------------------ HTTP control

    def _control_ops(self) -> dict[str, ControlOp]:
        """Besides every stand-in's ops: `fail` (fields of `HookFault`)."""
        return {
            **super()._control_ops(),
            "fail": lambda p: self.add_fault(HookFault(**fault_fields(HookFault, p))),
        }

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"secret": "***" if self.secret else self.secret, **self._fault_state()}

    # ------------------------------------------------------------------ the receiver

    def _stale(self, record: RecordedRequest) -> Response:
        return self._answer(record, 503, {"error": "the stand-in was reset meanwhile"})

    def _fault_answer(self, record: RecordedRequest, fault: HookFault) -> Response | None:
        if fault.raw_body is not None:
            return self._raw_answer(record, fault)
        if fault.status is None:
            return None
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else None
        return self._answer(record, fault.status, {"error": "injected fault"}, headers=headers)

    async def _unknown_path(self, request: Request) -> Response:
        record = await self._receive(request, kind="invalid")
        return self._answer(record, 404, {"error": f"no route {request.url.path}"})

    async def _hook(self, request: Request) -> Response:
        headers = {h: request.headers[h] for h in _HEADERS if h in request.headers}
        record = await self._receive(request, kind="event", headers=headers)
        record.extra["verified"] = self.secret is not None and review_webhook.verify(
            self.secret,
            headers.get("x-review-timestamp", ""),
            record.raw,
            headers.get("x-review-signature", ""),
            time.time(),
        )
        if not await self._delay(record, self.latency):
            return self._stale(record)
        injected = await self._injected(record, self._take_fault(lambda f: True))
        if injected is not None:
            return injected
        if self.secret is not None and not record.extra["verified"]:
            return self._answer(record, 401, {"error": "bad signature"}, kind="refused")
        return self._answer(record, 200, {"ok": True})
