"""Talking to Redis: the client (`redis_client`), the Lua scripts and how they are loaded and
called (`lua_source` reads them, `scripts` calls them by the names their headers give,
`script_settings` puts Settings in the units they read), group commit (`group_commit`,
`raw_pipeline`). Every key is spelled in shared/keys.py, not here."""
