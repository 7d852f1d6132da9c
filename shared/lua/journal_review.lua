-- journal_review: write the batch's review journal (shared/conversation/review_journal.py), as the lock
-- holder: the review decided for it and how far its hand-over got. Written before the provider
-- is told anything and before and after each hand-over step, so a worker resuming the batch
-- after a crash finishes that review instead of running the turn again, and never repeats a
-- step that was begun. finish.lua deletes it with the batch when it stores the review item.
-- The batch-hash field keeps its name from before the rename: workers of the previous release
-- read only that name during a rolling deploy (shared/conversation/review_journal.py, JOURNAL_FIELD).
--
-- KEYS[1] stats        HASH: unused, it routes the call to the tenant's slot
-- ARGV[1] conversation_prefix  the tenant's conversation key prefix ("wa:{t}:c:")
-- ARGV[2] person
-- ARGV[3] token        the lock token of the turn
-- ARGV[4] journal      the journal (JSON)
--
-- Returns 1, or 0 when the token does not hold the lock (a worker whose lease ended cannot
-- overwrite the journal of the one that took the batch over).
--
-- uses: lib/keys.lua (conv_key, BATCH, LOCK)
local prefix, person, token = ARGV[1], ARGV[2], ARGV[3]
if redis.call('GET', conv_key(prefix, person, LOCK)) ~= token then return 0 end
redis.call('HSET', conv_key(prefix, person, BATCH), 'handoff', ARGV[4])
return 1
