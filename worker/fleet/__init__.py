"""What the worker fleet does together: the scheduler (wake-ups, claims, due timers), the
wake-up queues (`wakeups`), leases and their renewal, heartbeats, the sweep that finds
abandoned work, retention of old review items, and the review webhook notifier."""
