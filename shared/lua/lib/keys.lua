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

-- A tenant's book prefixes, made once per tenant and kept between calls (a function library
-- keeps them; a claim asks for the windows' book at every batch): per kind, prefix -> book, for
-- at most BOOKS_KEPT tenants (then forgotten and made again).
local BOOKS_KEPT = 1000
local books_of = {}  -- make (the function that makes a kind's book) -> {books, n}

local function book_of(prefix, make)
  local kept = books_of[make]
  if not kept or kept.n >= BOOKS_KEPT then
    kept = {books = {}, n = 0}
    books_of[make] = kept
  end
  local book = kept.books[prefix]
  if not book then
    book = make(prefix)
    kept.books[prefix], kept.n = book, kept.n + 1
  end
  return book
end

local function make_out_book(out_prefix)
  return string.sub(out_prefix, 1, -(#OUTBOUND + 2)) .. OUTBOUND_BOOK .. ':'
end

local function out_book(out_prefix)
  return book_of(out_prefix, make_out_book)
end

-- The book of 24-hour windows (lib/lastin.lua) of the tenant whose conversation prefix is
-- `prefix` ("wa:{t}:c:" -> "wa:{t}:w:", shared/keys.py `lastin_book`).
local LASTIN_BOOK = '{{LASTIN_BOOK}}'

local function make_lastin_book(prefix)
  return string.sub(prefix, 1, -3) .. LASTIN_BOOK .. ':'
end

local function lastin_book(prefix)
  return book_of(prefix, make_lastin_book)
end
