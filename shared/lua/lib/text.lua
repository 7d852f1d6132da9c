-- Numbers as text, for the scripts that run at every turn. Lua makes a number's text with
-- sprintf("%.14g") (~3.5k instructions under callgrind), and a number passed to redis.call is
-- formatted so again by Redis (~2.2k); a string passed as it is costs nothing of the kind
-- (docs/benchmarks/worker.md, 2026-12-05). So the hot paths pass strings ('0', '-1', '1'),
-- and the small integers they do write (a batch's index in its claim, a shard's number) come
-- from a cache that a function library keeps between calls.
--
-- uses: none

local INT_TEXT_KEPT = 4096  -- integers 0 .. INT_TEXT_KEPT - 1 are kept once made
local int_texts = {}  -- n -> its text (kept between calls: nothing in it changes)

-- The decimal text of integer `n` (as tostring gives it for integers below 2^53).
local function int_text(n)
  local s = int_texts[n]
  if s == nil then
    s = string.format('%d', n)
    if n >= 0 and n < INT_TEXT_KEPT then int_texts[n] = s end
  end
  return s
end
