"""The settings, declared once each, in groups by what they are about.

Each field is one setting: its environment variable, default, rules, secret or not and a
one-line meaning (`setting(...)`, shared/settings/spec.py). `Settings`
(shared/settings/__init__.py) is
all the groups together; parsing, validation, masking, `env_names()` and the table in
docs/configuration.md follow from these declarations.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.settings.spec import mask_url, setting, time_zone_problem

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _is_tcp_port(port: int) -> bool:
    return 0 < port < 65536


def _is_key_prefix(prefix: str) -> bool:
    # The prefix starts every key, outside the `{tenant}` hash tag and before the first ':'.
    return bool(prefix) and not any(c in prefix for c in "{}: ")


_TOP_N = (lambda n: 0 <= n <= 1000, "be between 0 and 1000")


def _no_trailing_slash(url: str) -> str:
    return url.rstrip("/")


def _are_hosts(entries: tuple[str, ...]) -> bool:
    # What shared/fetch.py reads as an origin: a host alone is https on 443.
    for entry in entries:
        url = urlsplit(entry if "://" in entry else f"https://{entry}")
        try:
            url.port  # noqa: B018 -- raises for a port that is not one
        except ValueError:
            return False
        if url.scheme not in ("http", "https") or not url.hostname or url.username:
            return False
        if url.path not in ("", "/") or url.query or url.fragment:
            return False
    return True


_HOSTS = (_are_hosts, "list hosts as `host`, `host:port` or `http(s)://host[:port]`")


def _is_ca_file(path: str) -> bool:
    # Loaded as the Redis client will load it, so a wrong path or a file that is not PEM
    # stops start-up instead of failing every connection later.
    if not path:
        return True
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False
    return True


def _is_time_zone(name: str) -> bool:
    return time_zone_problem(name) == ""


def _is_webhook_hold(hold_s: float) -> bool:
    # Chatwoot gives up on a webhook after 5 s and does not retry a timed-out one.
    return 0 <= hold_s < 5


@dataclass(frozen=True)
class ConnectionSettings:
    """Redis and the receiver."""

    redis_url: str = setting(
        "REDIS_URL",
        "redis://127.0.0.1:6379/0",
        "Redis (`rediss://` for TLS)",
        prefixes=("redis://", "rediss://", "unix://"),
        show=mask_url,
    )
    redis_cluster: bool = setting(
        "REDIS_CLUSTER",
        False,
        "`true`: use the Redis Cluster client; `REDIS_URL` is then any node",
    )
    redis_timeout_s: float = setting(
        "REDIS_TIMEOUT_S",
        2.0,
        "a Redis answer slower than this fails (the receiver's writes: see `WEBHOOK_HOLD_S`)",
        above=0,
    )
    redis_tls_verify: str = setting(
        "REDIS_TLS_VERIFY",
        "required",
        "`required`: check a `rediss://` server's certificate and name; `none`: not (Heroku)",
        choices=("required", "none"),
    )
    redis_tls_ca_file: str = setting(
        "REDIS_TLS_CA_FILE",
        "",
        "a PEM file of the CA certificates to trust for `rediss://` ([TLS](deploying.md#tls))",
        rule=(_is_ca_file, "name a readable PEM file of CA certificates"),
    )
    webhook_hold_s: float = setting(
        "WEBHOOK_HOLD_S",
        4.0,
        "how long the receiver retries a webhook Redis did not take (then 503; Chatwoot 500)",
        rule=(_is_webhook_hold, "be >= 0 and < 5 (Chatwoot waits 5 s for an answer)"),
    )
    key_prefix: str = setting(
        "KEY_PREFIX",
        "wa",
        "first part of every key",
        rule=(_is_key_prefix, "be non-empty without '{', '}', ':' or spaces"),
    )
    port: int = setting(
        "PORT", 8000, "receiver port (Procfile)", rule=(_is_tcp_port, "be a TCP port")
    )


@dataclass(frozen=True)
class ProviderSettings:
    """The messaging providers: WhatsApp's Graph API and Chatwoot."""

    # --- WhatsApp (Meta's Graph API) -------------------------------------------------------
    whatsapp_app_secrets: tuple[str, ...] = setting(
        "WHATSAPP_APP_SECRET",
        (),
        "app secret(s), comma-separated during rotation; required to accept webhooks",
        secret=True,
    )
    whatsapp_verify_token: str = setting(
        "WHATSAPP_VERIFY_TOKEN", "", "token of Meta's subscription handshake", secret=True
    )
    whatsapp_access_token: str = setting(
        "WHATSAPP_ACCESS_TOKEN",
        "",
        "Graph API token (per-tenant tokens in `TENANTS_FILE`); setting it makes `whatsapp`"
        " the sender",
        secret=True,
    )
    whatsapp_api_base_url: str = setting(
        "WHATSAPP_API_BASE_URL",
        "https://graph.facebook.com",
        "Graph API address",
        normalize=_no_trailing_slash,
    )
    whatsapp_media_hosts: tuple[str, ...] = setting(
        "WHATSAPP_MEDIA_HOSTS",
        (),
        "hosts besides the Graph API's and Meta's (`lookaside.fbsbx.com`) a webhook's media"
        " `url` may be downloaded from with the Graph token (a proxy; `host`, `host:port`,"
        " `http://host:port`): any other `url` is ignored for the media id",
        rule=_HOSTS,
    )
    whatsapp_api_version: str = setting("WHATSAPP_API_VERSION", "v23.0", "Graph API version")
    whatsapp_timeout_s: float = setting(
        "WHATSAPP_TIMEOUT_S",
        15.0,
        "a Graph API call slower than this fails (connecting: at most 5 s); a send that timed"
        " out after its request went out is never repeated (review `delivery_unknown`), one"
        " that could not connect is retried with backoff",
        above=0,
    )

    # --- Chatwoot --------------------------------------------------------------------------
    chatwoot_base_url: str = setting(
        "CHATWOOT_BASE_URL",
        "https://app.chatwoot.com",
        "your Chatwoot installation",
        prefixes=("http://", "https://"),
        normalize=_no_trailing_slash,
    )
    chatwoot_media_hosts: tuple[str, ...] = setting(
        "CHATWOOT_MEDIA_HOSTS",
        (),
        "hosts besides `CHATWOOT_BASE_URL`'s that attachments (`data_url`) may be fetched from"
        " or redirected to: your installation's storage (S3, GCS) when it redirects there"
        " (`host`, `host:port`, `http://host:port`); any other attachment is not fetched",
        rule=_HOSTS,
    )
    chatwoot_api_access_token: str = setting(
        "CHATWOOT_API_ACCESS_TOKEN",
        "",
        "Chatwoot API token (`api_access_token`; per-tenant tokens in `TENANTS_FILE`); setting"
        " it makes the worker answer Chatwoot conversations through Chatwoot",
        secret=True,
        normalize=str.strip,
    )
    chatwoot_webhook_secrets: tuple[str, ...] = setting(
        "CHATWOOT_WEBHOOK_SECRET",
        (),
        "secret(s) of a signing Chatwoot webhook (`X-Chatwoot-Signature`), comma-separated"
        " during rotation",
        secret=True,
    )
    chatwoot_webhook_tokens: tuple[str, ...] = setting(
        "CHATWOOT_WEBHOOK_TOKEN",
        (),
        "token(s) the webhook URL carries (`/webhooks/chatwoot?token=…`) for Chatwoot versions"
        " and agent bots that do not sign; with neither set the route refuses everything (403)",
        secret=True,
    )
    chatwoot_only_pending: bool = setting(
        "CHATWOOT_ONLY_PENDING",
        False,
        "`true`: answer only conversations in status `pending` (with an agent bot, so a"
        " conversation a person took over gets no more bot replies)",
    )
    chatwoot_timeout_s: float = setting(
        "CHATWOOT_TIMEOUT_S",
        15.0,
        "a Chatwoot API call slower than this fails (connecting: at most 5 s); as with"
        " `WHATSAPP_TIMEOUT_S`, a reply or hand-over note whose request went out is never"
        " posted again",
        above=0,
    )


@dataclass(frozen=True)
class AISettings:
    """The brain: Claude through the Messages API, its tools, its outages."""

    anthropic_api_key: str = setting(
        "ANTHROPIC_API_KEY", "", "setting it makes `anthropic` the brain", secret=True
    )
    ai_model: str = setting(
        "AI_MODEL", "claude-sonnet-5-5", "models are retired over time: set yours"
    )
    system_prompt: str = setting(
        "SYSTEM_PROMPT",
        "You are a helpful assistant answering customers on WhatsApp.",
        "per-tenant prompts in `TENANTS_FILE` win",
        shown_default="a short generic prompt",
    )
    ai_max_tokens: int = setting(
        "AI_MAX_TOKENS", 1024, "the longest reply, in tokens, per Messages API call", above=0
    )
    ai_timeout_s: float = setting(
        "AI_TIMEOUT_S", 60.0, "a Messages API call slower than this fails", above=0
    )
    typing_refresh_s: float = setting(
        "TYPING_REFRESH_S",
        20.0,
        "while a turn runs, WhatsApp's typing indicator is shown again this often (Meta drops"
        " it after 25 s) until the reply goes out",
        above=0,
    )
    ai_fallback_text: str = setting(
        "AI_FALLBACK_TEXT", "", "sent for an empty AI answer (unset: review `empty_answer`)"
    )
    welcome_text: str = setting(
        "WELCOME_TEXT",
        "",
        "sent, without an AI call, when a person opens the chat (`request_welcome`; unset:"
        " that event starts no turn)",
    )
    ai_tools: tuple[str, ...] = setting("AI_TOOLS", (), "the brain's tools (docs/extending.md)")
    ai_hand_over_tool: bool = setting("AI_HAND_OVER_TOOL", True, "offer the hand-over tool")
    ai_hand_over_text: str = setting(
        "AI_HAND_OVER_TEXT", "A person from our team will continue here.", "sent at a hand-over"
    )
    ai_max_tool_rounds: int = setting(
        "AI_MAX_TOOL_ROUNDS", 8, "tool rounds per turn (one more: review `ai_tool_rounds`)", above=0
    )
    ai_tool_timeout_s: float = setting(
        "AI_TOOL_TIMEOUT_S", 20.0, "a tool slower than this answers the model an error", above=0
    )
    ai_turn_timeout_s: float = setting(
        "AI_TURN_TIMEOUT_S", 90.0, "the AI turn, tools included (then: `ai_deadline`)", above=0
    )
    memory_turns: int = setting(
        "MEMORY_TURNS", 10, "exchanges remembered per person (0: none)", at_least=0
    )
    memory_ttl_s: float = setting(
        "MEMORY_TTL_S", 86400.0, "a person's memory is forgotten after this idle time", above=0
    )
    brain: str = setting(
        "BRAIN",
        "echo",
        "`echo`, `anthropic`, or `package.module:attr`",
        default_when_set=("anthropic_api_key", "anthropic"),
    )
    sender: str = setting(
        "SENDER",
        "outbox",
        "`outbox`, `whatsapp`, or `package.module:attr`: answers WhatsApp conversations (and"
        " Chatwoot ones when `CHATWOOT_API_ACCESS_TOKEN` is unset, unless it is `whatsapp`)",
        default_when_set=("whatsapp_access_token", "whatsapp"),
    )
    tenants_file: str = setting("TENANTS_FILE", "", "TOML with per-tenant overrides (format below)")
    # Media of inbound messages, fetched by the worker during the turn (worker/brains/media.py).
    media_max_bytes: int = setting(
        "MEDIA_MAX_BYTES",
        20_000_000,
        "a larger media file is not downloaded: the AI is told it is too large (images over"
        " 3.75 MB too, the API's limit)",
        above=0,
    )
    media_timeout_s: float = setting(
        "MEDIA_TIMEOUT_S",
        20.0,
        "one media download (and its transcription) slower than this is given up: the AI is"
        " told so; never later than `AI_TURN_TIMEOUT_S` allows",
        above=0,
    )
    transcribe_base_url: str = setting(
        "TRANSCRIBE_BASE_URL",
        "",
        "an OpenAI-compatible speech-to-text API (`POST /audio/transcriptions`) for voice notes"
        " (unset: the AI is told a voice note arrived that it cannot hear)",
        normalize=_no_trailing_slash,
        show=mask_url,
    )
    transcribe_api_key: str = setting(
        "TRANSCRIBE_API_KEY", "", "bearer token of `TRANSCRIBE_BASE_URL`", secret=True
    )
    transcribe_model: str = setting(
        "TRANSCRIBE_MODEL", "whisper-1", "the speech-to-text model (`whisper-large-v3` on Groq)"
    )
    timezone: str = setting(
        "TIMEZONE",
        "UTC",
        "IANA time zone of the date and time the AI is shown with each batch (per tenant:"
        " `timezone`)",
        rule=(_is_time_zone, "be an IANA time zone name, e.g. America/Argentina/Buenos_Aires"),
    )


@dataclass(frozen=True)
class TurnSettings:
    """Turns (timing, leases, retries), logs, metrics and heartbeats."""

    debounce_window_s: float = setting(
        "DEBOUNCE_WINDOW_S", 20.0, "a batch is due this long after its last message…", above=0
    )
    max_wait_s: float = setting(
        "MAX_WAIT_S",
        60.0,
        "…but never later than this after its first (at least `DEBOUNCE_WINDOW_S`)",
        above=0,
    )
    lease_s: float = setting("LEASE_S", 120.0, "a running turn's lease", above=0)
    lease_renew_s: float = setting(
        "LEASE_RENEW_S",
        30.0,
        "how often a running turn's lease is renewed (shorter than `LEASE_S`)",
        above=0,
    )
    max_attempts: int = setting(
        "MAX_ATTEMPTS", 4, "attempts of a failing turn before it goes to review", above=0
    )
    retry_base_s: float = setting(
        "RETRY_BASE_S",
        5.0,
        "retries after `RETRY_BASE_S × 2^(attempt−1)`: 5, 10, 20 s",
        above=0,
    )
    review_after_s: float = setting(
        "REVIEW_AFTER_S",
        900.0,
        "a batch whose oldest message is older goes to review, unanswered",
        above=0,
    )
    human_pause_s: float = setting(
        "HUMAN_PAUSE_S",
        3600.0,
        "how long the bot stays silent for a person a human took over (an echo from the"
        " WhatsApp Business app, the AI's hand-over, a review) unless resumed sooner",
        above=0,
    )
    ai_outage_pause_s: float = setting(
        "AI_OUTAGE_PAUSE_S",
        1.0,
        "when the AI fails as a whole (429, 529, 5xx, timeouts) the fleet stops calling it this"
        " long, or the `retry-after` it asked for, doubling while it keeps failing; batches wait,"
        " their attempts not counted",
        above=0,
    )
    ai_outage_max_pause_s: float = setting(
        "AI_OUTAGE_MAX_PAUSE_S",
        4.0,
        "the longest such pause (≥ `AI_OUTAGE_PAUSE_S`): while the AI keeps failing, one worker"
        " asks it again this often, so waiting people are answered within about this long of its"
        " return; a longer `retry-after` is honoured",
        above=0,
    )
    worker_concurrency: int = setting(
        "WORKER_CONCURRENCY", 5, "turns at once per worker process", above=0
    )
    poll_interval_s: float = setting(
        "POLL_INTERVAL_S",
        1.0,
        "the fleet's safety sweep: one worker per interval probes every registered tenant for"
        " lost wake-ups, dead workers' leases and due times; wake-ups do not depend on it",
        above=0,
    )
    shutdown_grace_s: float = setting(
        "SHUTDOWN_GRACE_S",
        10.0,
        "how long running turns may finish after SIGTERM (may be 0)",
        at_least=0,
    )
    dedupe_ttl_s: int = setting(
        "DEDUPE_TTL_S",
        604800,
        "how long a provider id is remembered at least (Meta retries for 7 days; a marker is"
        " kept 1.5 × on average: [memory](benchmarks/memory.md))",
        above=0,
    )

    # --- Logs ------------------------------------------------------------------------------
    log_level: str = setting(
        "LOG_LEVEL",
        "INFO",
        "`DEBUG` adds the whole configuration at start-up and a line per HTTP call",
        choices=_LOG_LEVELS,
        normalize=str.upper,
    )
    log_format: str = setting(
        "LOG_FORMAT",
        "json",
        "`json`: one JSON object per line on stdout (Heroku convention); `text` for humans",
        choices=("json", "text"),
        normalize=str.lower,
    )

    # --- Metrics and worker heartbeats (docs/operating.md#metrics) --------------------------
    metrics_token: str = setting(
        "METRICS_TOKEN", "", "bearer token `GET /metrics` requires (unset: 404)", secret=True
    )
    metrics_fleet_max_age_s: float = setting(
        "METRICS_FLEET_MAX_AGE_S", 5.0, "fleet figures are read at most this often", at_least=0
    )
    metrics_tenants_top_n: int = setting(
        "METRICS_TENANTS_TOP_N", 20, "the N busiest tenants get series of their own", rule=_TOP_N
    )
    metrics_tenants: tuple[str, ...] = setting(
        "METRICS_TENANTS", (), "tenant ids (comma-separated) with series of their own anyway"
    )
    dyno: str = setting("DYNO", "", "set by Heroku (`web.1`): the receiver's `dyno` label")
    heartbeat_interval_s: float = setting(
        "HEARTBEAT_INTERVAL_S", 5.0, "a worker's heartbeat interval (dead after 3)", above=0
    )
