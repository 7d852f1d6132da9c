"""The CHATWOOT_* settings, and which sender answers a Chatwoot conversation."""

from __future__ import annotations

import pytest

from shared.chatwoot import account_of, tenant_id
from shared.keys import Keys
from shared.senders.chatwoot import ChatwootSender
from shared.senders.loading import OutboxSender, load_senders, plugin_of
from shared.senders.whatsapp import WhatsAppSender
from shared.settings import ConfigError, Settings
from shared.storage.group_commit import GroupCommitter
from shared.storage.scripts import Scripts


def test_chatwoot_settings_are_read_with_rotation_lists() -> None:
    s = Settings.from_env(
        {
            "CHATWOOT_BASE_URL": "http://127.0.0.1:3000/",
            "CHATWOOT_API_ACCESS_TOKEN": " tok ",
            "CHATWOOT_WEBHOOK_SECRET": "new, old,",
            "CHATWOOT_WEBHOOK_TOKEN": "t1",
            "CHATWOOT_ONLY_PENDING": "true",
        }
    )
    assert s.chatwoot_base_url == "http://127.0.0.1:3000"
    assert s.chatwoot_api_access_token == "tok"
    assert s.chatwoot_webhook_secrets == ("new", "old")
    assert s.chatwoot_webhook_tokens == ("t1",)
    assert s.chatwoot_only_pending is True
    shown = repr(s.masked())
    for secret in ("tok", "new", "old", "t1"):
        assert f"'{secret}'" not in shown


def test_chatwoot_defaults() -> None:
    s = Settings.from_env({})
    assert s.chatwoot_base_url == "https://app.chatwoot.com"
    assert (s.chatwoot_api_access_token, s.chatwoot_webhook_secrets) == ("", ())
    assert (s.chatwoot_webhook_tokens, s.chatwoot_only_pending) == ((), False)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CHATWOOT_BASE_URL", "app.chatwoot.com", "CHATWOOT_BASE_URL must start with http"),
        ("CHATWOOT_BASE_URL", " ", "CHATWOOT_BASE_URL is set but empty"),
        ("CHATWOOT_ONLY_PENDING", "sometimes", "CHATWOOT_ONLY_PENDING must be true or false"),
    ],
)
def test_bad_chatwoot_values_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: value})


def test_tenant_ids_never_look_like_phone_number_ids_and_fit_a_hash_tag() -> None:
    assert tenant_id(1, 3) == "cw-1-3" and account_of("cw-12-7") == "12"
    assert not tenant_id(1, 3).isdigit() and "{" not in tenant_id(1, 3)
    Keys().tenant(tenant_id(1, 3))  # a valid key
    for bad in ("106540352242922", "cw-1", "cw-a-3", "cw-1-3-4"):
        with pytest.raises(ValueError):
            account_of(bad)


class CustomSender:
    """`SENDER=tests.chatwoot.test_config:CustomSender`: a user's own sender."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def send(self, batch: object, text: str, part: int) -> str | None:
        return None


async def senders(**settings: object) -> dict[str, object]:
    loaded = load_senders(Settings(**settings), Keys(), GroupCommitter(None, Scripts()))
    for sender in {id(s): s for s in loaded.values()}.values():
        close = getattr(sender, "aclose", None)
        if close is not None:
            await close()
    return dict(loaded)


async def test_each_channel_gets_its_sender() -> None:
    # A Chatwoot token: the chatwoot sender for Chatwoot, SENDER's for WhatsApp.
    both = await senders(chatwoot_api_access_token="t", sender="whatsapp")
    assert isinstance(both["whatsapp"], WhatsAppSender)
    assert isinstance(both["chatwoot"], ChatwootSender)
    # No token, SENDER=outbox (local runs, tests): the outbox answers every channel.
    dev = await senders()
    assert isinstance(dev["whatsapp"], OutboxSender) and dev["chatwoot"] is dev["whatsapp"]
    # No token, SENDER=whatsapp: nothing can answer Chatwoot (its batches go to review).
    wa_only = await senders(sender="whatsapp")
    assert set(wa_only) == {"whatsapp"}
    # A custom sender answers every channel it is given.
    custom = await senders(sender="tests.chatwoot.test_config:CustomSender")
    assert isinstance(plugin_of(custom["whatsapp"]), CustomSender)  # adapted to a `Sender`
    assert custom["chatwoot"] is custom["whatsapp"]
