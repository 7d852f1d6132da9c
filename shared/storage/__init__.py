"""Talking to Redis: the client (`redis_client`), the Lua scripts and how they are loaded and
called (`lua_source`, `scripts`, `script_calls`), the receiver's group commit
(`group_commit`, `raw_pipeline`). Every key is spelled in shared/keys.py, not here."""
