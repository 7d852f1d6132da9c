"""Settings.from_env: the environment contract, its defaults, and validation that names the
variable at fault."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from shared.settings import SPECS, ConfigError, Settings, TenantConfig, env_names
from shared.settings import doc as settings_doc


def test_defaults_match_the_design_table() -> None:
    s = Settings.from_env({})
    assert (s.debounce_window_s, s.max_wait_s) == (20.0, 60.0)
    assert (s.lease_s, s.lease_renew_s) == (120.0, 30.0)
    assert (s.max_attempts, s.retry_base_s, s.review_after_s) == (4, 5.0, 900.0)
    assert (s.worker_concurrency, s.poll_interval_s, s.shutdown_grace_s) == (5, 1.0, 10.0)
    assert s.dedupe_ttl_s == 604800
    assert s.key_prefix == "wa" and s.brain == "echo" and s.sender == "outbox"
    assert s.whatsapp_api_base_url == "https://graph.facebook.com"
    assert s.whatsapp_timeout_s == 15.0 and s.chatwoot_timeout_s == 15.0


def test_durations_accept_decimals_and_names_map_to_fields() -> None:
    s = Settings.from_env(
        {
            "DEBOUNCE_WINDOW_S": "0.25",
            "MAX_WAIT_S": " 1.5 ",
            "LEASE_S": "2",
            "LEASE_RENEW_S": "0.5",
            "RETRY_BASE_S": "0.2",
            "REVIEW_AFTER_S": "30",
            "SHUTDOWN_GRACE_S": "0",
            "POLL_INTERVAL_S": "0.1",
            "MAX_ATTEMPTS": "2",
            "WORKER_CONCURRENCY": "12",
            "KEY_PREFIX": "t1",
            "REDIS_URL": "redis://:pw@example:6380/2",
            "REDIS_CLUSTER": "yes",
            "WHATSAPP_APP_SECRET": "new, old ,",
            "WHATSAPP_API_BASE_URL": "http://127.0.0.1:9000/",
            "WHATSAPP_TIMEOUT_S": "2.5",
            "CHATWOOT_TIMEOUT_S": "0.75",
        }
    )
    assert (s.debounce_window_s, s.max_wait_s, s.lease_s, s.lease_renew_s) == (0.25, 1.5, 2, 0.5)
    assert (s.retry_base_s, s.review_after_s, s.shutdown_grace_s) == (0.2, 30.0, 0.0)
    assert (s.poll_interval_s, s.max_attempts, s.worker_concurrency) == (0.1, 2, 12)
    assert s.key_prefix == "t1" and s.redis_cluster is True
    assert s.whatsapp_app_secrets == ("new", "old")
    assert s.whatsapp_api_base_url == "http://127.0.0.1:9000"
    assert s.whatsapp_timeout_s == 2.5 and s.chatwoot_timeout_s == 0.75


def test_an_api_key_makes_the_real_ai_the_default_brain() -> None:
    assert Settings.from_env({"ANTHROPIC_API_KEY": "sk-test"}).brain == "anthropic"
    assert Settings.from_env({"ANTHROPIC_API_KEY": "sk", "BRAIN": "echo"}).brain == "echo"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEBOUNCE_WINDOW_S", "abc", "DEBOUNCE_WINDOW_S must be a number, got 'abc'"),
        ("LEASE_S", "2s", "LEASE_S must be a number"),
        ("MAX_ATTEMPTS", "2.5", "MAX_ATTEMPTS must be an integer"),
        ("WORKER_CONCURRENCY", "five", "WORKER_CONCURRENCY must be an integer"),
        ("PORT", "http", "PORT must be an integer"),
        ("DEDUPE_TTL_S", "1.5", "DEDUPE_TTL_S must be an integer"),
        ("DEBOUNCE_WINDOW_S", "0", "DEBOUNCE_WINDOW_S must be > 0"),
        ("RETRY_BASE_S", "-1", "RETRY_BASE_S must be > 0"),
        ("MAX_ATTEMPTS", "0", "MAX_ATTEMPTS must be > 0"),
        ("WORKER_CONCURRENCY", "0", "WORKER_CONCURRENCY must be > 0"),
        ("POLL_INTERVAL_S", "0", "POLL_INTERVAL_S must be > 0"),
        ("REVIEW_AFTER_S", "-5", "REVIEW_AFTER_S must be > 0"),
        ("LEASE_S", "-inf", "LEASE_S must be a finite number"),
        ("SHUTDOWN_GRACE_S", "-1", "SHUTDOWN_GRACE_S must be >= 0"),
        ("PORT", "70000", "PORT must be a TCP port"),
        ("REDIS_CLUSTER", "maybe", "REDIS_CLUSTER must be true or false"),
        ("REDIS_URL", "http://localhost", "REDIS_URL must start with"),
        ("REDIS_URL", "  ", "REDIS_URL is set but empty"),
        ("KEY_PREFIX", "wa:x", "KEY_PREFIX must be non-empty"),
        ("KEY_PREFIX", "{wa}", "KEY_PREFIX must be non-empty"),
        ("BRAIN", "", "BRAIN is set but empty"),
        ("WHATSAPP_TIMEOUT_S", "0", "WHATSAPP_TIMEOUT_S must be > 0"),
        ("WHATSAPP_TIMEOUT_S", "-1", "WHATSAPP_TIMEOUT_S must be > 0"),
        ("WHATSAPP_TIMEOUT_S", "soon", "WHATSAPP_TIMEOUT_S must be a number"),
        ("CHATWOOT_TIMEOUT_S", "0", "CHATWOOT_TIMEOUT_S must be > 0"),
        ("CHATWOOT_TIMEOUT_S", "soon", "CHATWOOT_TIMEOUT_S must be a number"),
    ],
)
def test_bad_values_stop_start_up_naming_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({name: value})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBOUNCE_WINDOW_S", "nan"),
        ("LEASE_S", "nan"),
        ("LEASE_S", "inf"),
        ("RETRY_BASE_S", "nan"),
        ("RETRY_BASE_S", "inf"),
        ("POLL_INTERVAL_S", "nan"),
        ("WHATSAPP_TIMEOUT_S", "inf"),
        ("CHATWOOT_TIMEOUT_S", "inf"),
    ],
)
def test_non_finite_durations_are_rejected(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value, "MAX_WAIT_S": "1e9"})


def test_lease_renewal_must_be_shorter_than_the_lease() -> None:
    with pytest.raises(ConfigError, match=r"LEASE_RENEW_S \(2.0\) must be shorter than LEASE_S"):
        Settings.from_env({"LEASE_S": "2", "LEASE_RENEW_S": "2"})
    with pytest.raises(ConfigError, match="LEASE_RENEW_S"):
        Settings.from_env({"LEASE_S": "2", "LEASE_RENEW_S": "3"})
    # The default renewal (30 s) is longer than a short lease: a short lease needs its own.
    with pytest.raises(ConfigError, match="LEASE_RENEW_S"):
        Settings.from_env({"LEASE_S": "2"})


def test_max_wait_cannot_be_shorter_than_the_window() -> None:
    with pytest.raises(ConfigError, match=r"MAX_WAIT_S \(1.0\) must be >= DEBOUNCE_WINDOW_S"):
        Settings.from_env({"DEBOUNCE_WINDOW_S": "2", "MAX_WAIT_S": "1"})
    assert Settings.from_env({"DEBOUNCE_WINDOW_S": "2", "MAX_WAIT_S": "2"}).max_wait_s == 2


def test_with_overrides_validates_like_from_env() -> None:
    s = Settings()
    assert s.with_overrides(lease_s=3, lease_renew_s=1).lease_s == 3
    with pytest.raises(ConfigError, match="LEASE_RENEW_S"):
        s.with_overrides(lease_s=3)


def test_tenants_file_overrides_window_and_max_wait(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[tenants."111"]\ndebounce_window_s = 2.5\nmax_wait_s = 9\nhuman_pause_s = 600\n'
        '[tenants."222"]\nsystem_prompt = "Sé breve."\n'
    )
    s = Settings.from_env({"TENANTS_FILE": str(path)})
    first, second = s.tenant("111"), s.tenant("222")
    assert first.debounce_window_s == 2.5 and first.max_wait_s == 9
    assert first.human_pause_s == 600 and second.human_pause_s == s.human_pause_s == 3600
    assert second.debounce_window_s == s.debounce_window_s == 20
    assert second.system_prompt == "Sé breve."
    assert s.tenant("333") == TenantConfig.resolve({}, s)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[tenants", "is not valid TOML"),
        ('[tenants."1"]\nwindow = 3\n', "unknown keys ['window']"),
        ('[tenants."1"]\ndebounce_window_s = 0\n', "debounce_window_s must be a number > 0"),
        ('[tenants."1"]\nmax_wait_s = "soon"\n', "max_wait_s must be a number > 0"),
        ('[tenants."1"]\nhuman_pause_s = -1\n', "human_pause_s must be a number > 0"),
        ('tenants = "x"\n', "[tenants] must be a table"),
        ('[tenants."1"]\nmax_tokens = 0\n', "tenants.1.max_tokens must be a whole number >= 1"),
        ('[tenants."1"]\nmax_tokens = 2.5\n', "max_tokens must be a whole number >= 1"),
        ('[tenants."1"]\nmax_tokens = true\n', "max_tokens must be a whole number >= 1"),
        ('[tenants."1"]\nmemory_turns = -1\n', "memory_turns must be a whole number >= 0"),
        ('[tenants."1"]\nmemory_turns = "5"\n', "memory_turns must be a whole number >= 0"),
        ('[tenants."1"]\nmodel = ""\n', "tenants.1.model must be a non-empty string"),
        ('[tenants."1"]\nmodel = 4\n', "model must be a non-empty string"),
        ('[tenants."1"]\nlanguage = " "\n', "language must be a non-empty string"),
        ('[tenants."1"]\nsystem_prompt = 3\n', "system_prompt must be a string"),
        ('[tenants."1"]\nwelcome_text = 3\n', "welcome_text must be a string"),
        ('[tenants."1"]\naccess_token = 3\n', "access_token must be a string"),
        ('[tenants."1"]\ntemplate = ["a"]\n', "template must be a string"),
        ('[tenants."1"]\ntimezone = "Mars/Base"\n', "timezone must be an IANA time zone name"),
    ],
)
def test_bad_tenants_files_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"TENANTS_FILE": str(path)})
    assert "TENANTS_FILE" in str(caught.value) and message in str(caught.value)


def test_tenants_file_ai_settings_and_their_fallbacks(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[tenants."111"]\nmodel = "claude-opus-4-8"\nmax_tokens = 300\nmemory_turns = 0\n'
        'language = "es-AR"\n'
        '[tenants."222"]\nmemory_turns = 3\n'
    )
    s = Settings.from_env({"TENANTS_FILE": str(path), "MEMORY_TURNS": "6"})
    first = s.tenant("111")
    assert (first.model, first.max_tokens, first.language) == ("claude-opus-4-8", 300, "es-AR")
    assert s.tenant("111").memory_turns == 0, "0 is a value: no memory, not the default"
    assert s.tenant("222").memory_turns == 3 and s.tenant("333").memory_turns == 6
    assert s.tenant("222").model == s.ai_model and s.tenant("222").max_tokens == s.ai_max_tokens
    assert s.tenant("222").language == "", "no language: no hint"


def test_the_default_model_is_a_current_one_the_sdk_knows() -> None:
    from typing import get_args

    from anthropic.types.model_param import ModelParam

    known = {name for arg in get_args(ModelParam) for name in get_args(arg)}
    assert Settings().ai_model in known and "sonnet" in Settings().ai_model


def test_a_missing_tenants_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"TENANTS_FILE .* cannot be read"):
        Settings.from_env({"TENANTS_FILE": str(tmp_path / "nope.toml")})


def test_masked_hides_secrets_and_redis_password() -> None:
    s = Settings.from_env(
        {
            "REDIS_URL": "redis://user:hunter2@redis.internal:6379/0",
            "WHATSAPP_APP_SECRET": "s1,s2",
            "WHATSAPP_ACCESS_TOKEN": "EAAG-token",
            "ANTHROPIC_API_KEY": "sk-ant-secret",
        }
    )
    shown = repr(s.masked())
    for secret in ("hunter2", "s1", "EAAG-token", "sk-ant-secret"):
        assert secret not in shown
    assert s.masked()["redis_url"] == "redis://***@redis.internal:6379/0"
    assert s.masked()["whatsapp_app_secrets"] == ["***", "***"]


def test_every_field_is_declared_once_with_its_own_variable() -> None:
    assert {f.name for f in fields(Settings)} - {spec.name for spec in SPECS} == {"tenants"}
    variables = [spec.env for spec in SPECS]
    assert len(variables) == len(set(variables)) and env_names() == set(variables)
    assert all(spec.doc and spec.kind is not None for spec in SPECS)


def test_every_secret_is_masked_because_it_is_declared_secret() -> None:
    secrets = [spec for spec in SPECS if spec.secret]
    assert {spec.env for spec in secrets} >= {"WHATSAPP_APP_SECRET", "ANTHROPIC_API_KEY"}
    # Long enough for every rule (OPS_TOKEN: at least 32 characters).
    env = {spec.env: f"hidden-{spec.env}-{'0' * 32}" for spec in secrets}
    # OPS_USERS must parse: a token credential, the secret to hide being the whole value.
    env["OPS_USERS"] = f"hidden-OPS_USERS:sha256${'0' * 64}"
    s = Settings.from_env(env)
    shown = repr(s.masked())
    assert not [spec.env for spec in secrets if f"hidden-{spec.env}" in shown]


def test_the_configuration_page_shows_the_declared_settings() -> None:
    """docs/configuration.md's table is generated (`python -m shared.settings.doc`): a setting
    added, removed or changed without regenerating it fails here."""
    page = settings_doc.PAGE.read_text()
    assert settings_doc.render(page) == page, "run: python -m shared.settings.doc"
    for spec in SPECS:
        assert f"| `{spec.env}` |" in page


def test_the_longest_ai_pause_cannot_be_shorter_than_the_first() -> None:
    with pytest.raises(
        ConfigError, match=r"AI_OUTAGE_MAX_PAUSE_S \(1.0\) must be >= AI_OUTAGE_PAUSE_S"
    ):
        Settings.from_env({"AI_OUTAGE_PAUSE_S": "2", "AI_OUTAGE_MAX_PAUSE_S": "1"})
    assert Settings.from_env({"AI_OUTAGE_PAUSE_S": "2", "AI_OUTAGE_MAX_PAUSE_S": "2"})


def test_welcome_text_per_tenant_falls_back_to_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[tenants."111"]\nwelcome_text = " ¡Hola! "\n[tenants."222"]\nwelcome_text = ""\n'
    )
    s = Settings.from_env({"TENANTS_FILE": str(path), "WELCOME_TEXT": "Hi"})
    assert s.tenant("111").welcome_text == "¡Hola!"
    assert s.tenant("222").welcome_text == "", "an empty tenant text turns the welcome off"
    assert s.tenant("333").welcome_text == "Hi"
    assert Settings.from_env({}).tenant("333").welcome_text == "", "unset: no welcome turn"


# Every value a tenant can set: (its line in TENANTS_FILE, the view's field and the value it
# holds, the global setting and the value a tenant without the line gets).
EVERY_OVERRIDE = [
    ("debounce_window_s = 2.5", "debounce_window_s", 2.5, "DEBOUNCE_WINDOW_S=5", 5.0),
    ("max_wait_s = 9", "max_wait_s", 9, "MAX_WAIT_S=50", 50.0),
    ('system_prompt = "Sé breve."', "system_prompt", "Sé breve.", "SYSTEM_PROMPT=Be", "Be"),
    ('access_token = "EAAGx"', "whatsapp_access_token", "EAAGx", "WHATSAPP_ACCESS_TOKEN=g", "g"),
    (
        'access_token = "EAAGx"',
        "chatwoot_api_access_token",
        "EAAGx",
        "CHATWOOT_API_ACCESS_TOKEN=c",
        "c",
    ),
    ('template = "reengagement_es"', "template", "reengagement_es", "", ""),
    ('template_language = "es"', "template_language", "es", "", "en_US"),
    ('model = "opus"', "model", "opus", "AI_MODEL=haiku", "haiku"),
    ("max_tokens = 300", "max_tokens", 300, "AI_MAX_TOKENS=500", 500),
    ("memory_turns = 0", "memory_turns", 0, "MEMORY_TURNS=7", 7),
    ('language = "es-AR"', "language", "es-AR", "", ""),
    ('fallback_text = " ¿Y? "', "fallback_text", "¿Y?", "AI_FALLBACK_TEXT= Eh? ", "Eh?"),
    ('hand_over_text = "Te paso"', "hand_over_text", "Te paso", "AI_HAND_OVER_TEXT=Wait", "Wait"),
    ('welcome_text = " ¡Hola! "', "welcome_text", "¡Hola!", "WELCOME_TEXT= Hi ", "Hi"),
    ('timezone = "America/Lima"', "timezone", "America/Lima", "TIMEZONE=Asia/Tokyo", "Asia/Tokyo"),
    ("human_pause_s = 600", "human_pause_s", 600, "HUMAN_PAUSE_S=900", 900.0),
]


def test_every_value_a_tenant_sets_wins_and_others_get_the_global_one(tmp_path: Path) -> None:
    assert sorted(row[1] for row in EVERY_OVERRIDE) == sorted(f.name for f in fields(TenantConfig))
    path = tmp_path / "tenants.toml"
    path.write_text('[tenants."111"]\n' + "\n".join(sorted({row[0] for row in EVERY_OVERRIDE})))
    env = dict(row[3].split("=", 1) for row in EVERY_OVERRIDE if row[3])
    s = Settings.from_env({**env, "TENANTS_FILE": str(path)})
    own, other = s.tenant("111"), s.tenant("999")
    for _, name, value, _, global_value in EVERY_OVERRIDE:
        assert getattr(own, name) == value, f"the tenant's {name}"
        assert getattr(other, name) == global_value, f"a tenant not in the file: global {name}"
    assert s.tenant("111") is own and s.tenant("998") is other, "resolved once, not per call"
    assert "EAAGx" not in repr(own), "the tokens stay out of logs"


def test_an_empty_string_in_the_tenants_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[tenants."111"]\nsystem_prompt = ""\naccess_token = ""\nhand_over_text = ""\n'
        'fallback_text = " "\ntemplate_language = ""\n'
    )
    s = Settings.from_env({"TENANTS_FILE": str(path), "AI_FALLBACK_TEXT": "Sorry?"})
    own = s.tenant("111")
    assert (own.system_prompt, own.hand_over_text) == (s.system_prompt, s.ai_hand_over_text)
    assert own.whatsapp_access_token == own.chatwoot_api_access_token == "", "the global ones"
    assert own.fallback_text == "Sorry?", "a blank fallback text is no fallback text"
    assert own.template_language == "", "taken as written"


def test_tenants_given_to_with_overrides_are_checked_like_the_file() -> None:
    with pytest.raises(ConfigError, match=r"tenants\.1 has unknown keys \['window'\]"):
        Settings().with_overrides(tenants={"1": {"window": 3}})
    with pytest.raises(ConfigError, match=r"tenants\.1\.human_pause_s must be a number > 0"):
        Settings().with_overrides(tenants={"1": {"human_pause_s": 0}})
