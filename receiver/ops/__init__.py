"""The ops page: review items and conversations for the people who work beside the bot.

Mounted by the receiver under `/ops` only when `OPS_TOKEN` is set (docs/operating.md, "The
ops page"). Modules by job: `auth` (sign-in, session cookie, CSRF), `queries` (what the pages
read from Redis), `actions` (what people change, each audited), `web` (templates and the
guards of every endpoint), `routes` (the endpoints); the HTML is in `templates/`.
"""
