"""Helpers of the ops page's tests: settings with an ops token, review items parked as the
worker parks them, signing in, and the CSRF token read from a page as a browser would."""

from __future__ import annotations

import functools
import re

import httpx

from shared.settings import Settings
from tests.worker.support import park as park_batch

OPS_TOKEN = "ops-test-token-0123456789abcdefghijklmnop"
TENANT = "106500000000001"
PERSON = "5491155550001"


def ops_settings(settings: Settings, **overrides: object) -> Settings:
    return settings.with_overrides(ops_token=OPS_TOKEN, **overrides)


# Review items parked for the ops page's tenant and person unless a test names others.
park = functools.partial(park_batch, tenant=TENANT, person=PERSON)


async def sign_in(client: httpx.AsyncClient, name: str = "Ana") -> str:
    """Sign in with the ops token; the CSRF token of the session."""
    answer = await client.post("/ops/signin", data={"token": OPS_TOKEN, "name": name})
    assert answer.status_code == 303, answer.text
    return await csrf_of(client)


async def csrf_of(client: httpx.AsyncClient, path: str = "/ops/") -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)
