"""The records the receiver and the workers share about the fleet itself: the wake-up queues
(`wake`), the workers' heartbeats, and the figures a turn adds to the tenant's stats
(`turn_figures`, `dispatch_lag`)."""
