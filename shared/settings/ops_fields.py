"""Settings of the people who work beside the bot: the ops page, retention of what they see.

A group of its own (composed into `Settings` like those of shared/settings/fields.py), so the
ops page and the human takeover grow here without crowding the pipeline's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.ops.accounts import accounts_problem
from shared.settings.spec import ConfigError, mask_url, setting

_DAY_S = 86400.0
OPS_TOKEN_MIN_CHARS = 32  # 32 hex characters are 128 bits: beyond guessing, back-off or not


def _is_long_token(token: str) -> bool:
    return token == "" or len(token) >= OPS_TOKEN_MIN_CHARS


def _is_http_url(url: str) -> bool:
    return url == "" or (url.startswith(("http://", "https://")) and len(url) > len("https://"))


@dataclass(frozen=True)
class OpsSettings:
    """The ops page (docs/operating.md#the-ops-page) and how long review items and its audit
    log are kept."""

    ops_token: str = setting(
        "OPS_TOKEN",
        "",
        "the token that signs in to the ops page under `/ops` (unset: `/ops` is 404); at least"
        f" {OPS_TOKEN_MIN_CHARS} characters (`openssl rand -hex 32`)",
        secret=True,
        rule=(
            _is_long_token,
            f"be at least {OPS_TOKEN_MIN_CHARS} characters (make one: `openssl rand -hex 32`)",
        ),
    )
    ops_users: str = setting(
        "OPS_USERS",
        "",
        "the ops page's accounts, one per operator, comma-separated `name:credential`"
        " (`python -m shared.ops.accounts password NAME` or `token NAME` makes one); the audit"
        " records the account's name. Works beside or without `OPS_TOKEN`",
        secret=True,
    )
    ops_session_s: float = setting(
        "OPS_SESSION_S",
        12 * 3600.0,
        "how long a sign-in to the ops page lasts (changing `OPS_TOKEN` or `OPS_USERS` ends"
        " every sign-in)",
        above=0,
    )
    ops_signin_free_attempts: int = setting(
        "OPS_SIGNIN_FREE_ATTEMPTS",
        5,
        "failed sign-ins to the ops page a client (address) or a name may make before each"
        " further attempt must wait (429 with `Retry-After`); a sign-in that succeeds resets",
        at_least=1,
    )
    ops_signin_backoff_s: float = setting(
        "OPS_SIGNIN_BACKOFF_S",
        1.0,
        "the wait after the free failed sign-ins are used up, doubling with each further"
        " failure up to `OPS_SIGNIN_BACKOFF_MAX_S`",
        above=0,
    )
    ops_signin_backoff_max_s: float = setting(
        "OPS_SIGNIN_BACKOFF_MAX_S",
        900.0,
        "the longest wait between failed sign-ins; failures are forgotten this long after the"
        " last one's wait ended",
        above=0,
    )
    review_retention_s: float = setting(
        "REVIEW_RETENTION_S",
        30 * _DAY_S,
        "review items and ops audit entries older than this are deleted",
        above=0,
    )
    review_webhook_url: str = setting(
        "REVIEW_WEBHOOK_URL",
        "",
        "where the workers POST a signed JSON event for every new review item"
        " (docs/operating.md#being-told; unset: nothing is queued or sent)",
        rule=(_is_http_url, "be an http:// or https:// URL"),
        show=mask_url,
    )
    review_webhook_secret: str = setting(
        "REVIEW_WEBHOOK_SECRET",
        "",
        "the key of the events' HMAC-SHA256 signature (`X-Review-Signature`); required with"
        " `REVIEW_WEBHOOK_URL`",
        secret=True,
    )
    review_webhook_timeout_s: float = setting(
        "REVIEW_WEBHOOK_TIMEOUT_S",
        10.0,
        "how long one POST of a review event may take before it is retried",
        above=0,
    )
    review_webhook_retry_s: float = setting(
        "REVIEW_WEBHOOK_RETRY_S",
        5.0,
        "the first retry's delay after a failed POST (network error, 5xx, 429), doubling up"
        " to 10 minutes; a `Retry-After` the receiver sends is honoured",
        above=0,
    )
    review_webhook_give_up_s: float = setting(
        "REVIEW_WEBHOOK_GIVE_UP_S",
        _DAY_S,
        "a review event not delivered this long after its item was created is given up"
        " (counted, logged; the item stays on the review list)",
        above=0,
    )

    def check_signin_backoff(self) -> None:
        """Cross-field rule: the back-off's cap is not below its first step."""
        if self.ops_signin_backoff_max_s < self.ops_signin_backoff_s:
            raise ConfigError(
                f"OPS_SIGNIN_BACKOFF_MAX_S ({self.ops_signin_backoff_max_s}) must be >="
                f" OPS_SIGNIN_BACKOFF_S ({self.ops_signin_backoff_s})"
            )

    def check_ops_users(self) -> None:
        """Every account of `OPS_USERS` can be checked: a typo stops the process at start-up
        rather than locking an operator out at the first sign-in."""
        problem = accounts_problem(self.ops_users)
        if problem:
            raise ConfigError(f"OPS_USERS: {problem}")

    @property
    def ops_enabled(self) -> bool:
        """The ops page exists: someone can sign in to it."""
        return bool(self.ops_token or self.ops_users)

    def check_review_webhook(self) -> None:
        """Cross-field rule: a review webhook is always signed, so a receiver can trust it."""
        if self.review_webhook_url and not self.review_webhook_secret:
            raise ConfigError(
                "REVIEW_WEBHOOK_URL is set but REVIEW_WEBHOOK_SECRET is not: review events are"
                " always signed, set a secret the receiver verifies with"
            )
