"""A conversation as both processes read and write it: the claimed batch and its messages
(`batch`), the errors a turn ends with (`errors`, `unknowns`), what a turn has done so far
(`turn_state`), the review journal, late delivery failures, and how messages and replies are
written down for the model and the memory (`presentation`, `human_memory`).

Pure data and rules: no Redis calls, no HTTP."""
