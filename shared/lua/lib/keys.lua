-- The keys of one conversation. Scripts that visit many conversations (claim) cannot receive
-- every key through KEYS: they get the tenant's conversation prefix ("wa:{t}:c:", same hash
-- tag as their KEYS) and build the rest with conv_key. The suffixes are spelled in
-- shared/keys.py only; the loader writes them in for the placeholders.

local PENDING, BATCH, LOCK = '{{PENDING}}', '{{BATCH}}', '{{LOCK}}'
local LASTIN, MEMORY, CONTEXT = '{{LASTIN}}', '{{MEMORY}}', '{{CONTEXT}}'
local SILENT = '{{SILENT}}'
local HUMAN = '{{HUMAN}}'
local SENT, LATE = '{{SENT}}', '{{LATE}}'

local function conv_key(prefix, person, kind)
  return prefix .. person .. ':' .. kind
end

-- The outbound records' book (lib/book.lua) of the tenant whose outbound prefix is `out_prefix`
-- ("wa:{t}:out:" -> "wa:{t}:o:").
local OUTBOUND, OUTBOUND_BOOK = '{{OUTBOUND}}', '{{OUTBOUND_BOOK}}'

local function out_book(out_prefix)
  return string.sub(out_prefix, 1, -(#OUTBOUND + 2)) .. OUTBOUND_BOOK .. ':'
end

-- The book of 24-hour windows (lib/lastin.lua) of the tenant whose conversation prefix is
-- `prefix` ("wa:{t}:c:" -> "wa:{t}:w:", shared/keys.py `lastin_book`).
local LASTIN_BOOK = '{{LASTIN_BOOK}}'

local function lastin_book(prefix)
  return string.sub(prefix, 1, -3) .. LASTIN_BOOK .. ':'
end
