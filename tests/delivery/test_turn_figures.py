"""A worker process running the Claude brain against the Messages API stand-in adds each turn's
AI calls (latency and `usage` tokens) and sends to the tenant's figures, and `/metrics` shows
them: the fleet totals and the tenant's own series equal what the stand-in answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from scripts.standins import GraphApiStandIn, MessagesApiStandIn
from shared.fleet.turn_figures import SEND
from shared.settings import Settings
from tests.delivery.support import TENANT, TENANT_PROMPT, TENANTS_TOML, ai_requests
from tests.receiver.support import running
from tests.support.helpers import RedisTarget
from tests.worker.support import WorkerFleet, push_message, stats, wait_for

pytestmark = pytest.mark.slow
METRICS_TOKEN = "figures-token"
# Long enough to pass the model's minimum cacheable prefix, so both cache counts move.
LONG_PROMPT = "Sos el asistente de Turnos SRL: respondé breve y con amabilidad. " * 100
USAGE_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_write": "cache_creation_input_tokens",
}


def use_long_prompt(env: dict[str, str]) -> None:
    """The tenant's own prompt, made long (TENANTS_FILE's prompt wins over SYSTEM_PROMPT)."""
    Path(env["TENANTS_FILE"]).write_text(TENANTS_TOML.replace(TENANT_PROMPT, LONG_PROMPT))


async def scrape(settings: Settings) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with running(settings) as client:
        response = await client.get(
            "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
        )
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


async def test_tokens_and_latencies_of_the_anthropic_brain_show_up_in_metrics(
    redis: Redis,
    redis_target: RedisTarget,
    prefix: str,
    env: dict[str, str],
    fleet: WorkerFleet,
    graph: GraphApiStandIn,
    ai: MessagesApiStandIn,
) -> None:
    use_long_prompt(env)
    await fleet.start(1, **env)
    # The first call fails (529, retried by the worker after RETRY_BASE_S): it counts as an
    # AI call with its latency, and no tokens.
    ai.fail_next(1, "overloaded")
    await push_message(redis, prefix, "5491155550031", "wamid.f1", "hola", tenant=TENANT)

    async def turns(n: int) -> bool:
        return (await stats(redis, prefix, TENANT)).get("turns", 0) >= n

    await wait_for(lambda: turns(1), "the first turn", timeout_s=20)
    # A second person of the same tenant: the same system prompt, read from the cache.
    await push_message(redis, prefix, "5491155550032", "wamid.f2", "buenas", tenant=TENANT)
    await wait_for(lambda: turns(2), "the second turn", timeout_s=20)

    calls = ai_requests(ai)
    assert len(calls) == 3 and calls[0].status == 529
    answered: list[dict[str, Any]] = [c.response["usage"] for c in calls[1:]]
    expected = {kind: sum(u[name] for u in answered) for kind, name in USAGE_KINDS.items()}
    # Every input token is read from or written to the cache here (the current message is
    # marked for the next turn), so only the other three kinds must move.
    assert expected["output"] > 0
    assert expected["cache_write"] > 0 and expected["cache_read"] > 0  # the stand-in caches

    # The figures are written right after each turn's finish: wait for the last ones.
    async def recorded() -> bool:
        return SEND.count_of(await stats(redis, prefix, TENANT)) == 2

    await wait_for(recorded, "both turns' figures", timeout_s=10)
    settings = Settings.from_env(
        {**redis_target.env(), "KEY_PREFIX": prefix, "METRICS_TOKEN": METRICS_TOKEN}
    )
    samples = await scrape(settings)
    for kind, n in expected.items():
        # A kind that stayed at 0 may have no series at all.
        assert samples.get(("wa_ai_tokens_total", (("kind", kind),)), 0) == n, kind
        tenant_series = ("wa_tenant_ai_tokens_total", (("kind", kind), ("tenant", TENANT)))
        assert samples.get(tenant_series, 0) == n, kind
    assert samples[("wa_ai_call_seconds_count", ())] == 3
    assert samples[("wa_ai_call_seconds_bucket", (("le", "+Inf"),))] == 3
    assert 0 < samples[("wa_ai_call_seconds_sum", ())] < 30
    assert samples[("wa_send_seconds_count", ())] == 2  # one part per reply
    assert len(graph.sent_texts()) == 2
    assert 0 < samples[("wa_send_seconds_sum", ())] < 30
