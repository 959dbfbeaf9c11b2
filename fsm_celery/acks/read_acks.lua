-- Read a batch for the ack bridge from every ack stream in KEYS[1..n], bounded in bytes of
-- every field: an entry over the payload limit never leaves Redis, and a call loads at most
-- its byte budget plus one stream cap.
--
-- KEYS: the ack streams, then the dead-letter stream (KEYS[n + 1]).
-- ARGV: group, consumer, mode ('>' new entries, '0' this consumer's pending ones), most entries,
--       most bytes touched, the stream to start from (1-based; turns round for fairness),
--       payload limit (bytes of an entry, all its fields and their names counted), stream cap.
--
-- Redis cannot tell an entry's size without loading it (loading 200 MB into Lua stalls every
-- client for seconds), but MEMORY USAGE tells a stream's in O(nodes), copying nothing. So:
-- - a stream over the cap is never read: it is dropped whole (UNLINK frees it off the main
--   thread) and recorded in the dead-letter stream with its size;
-- - a stream that fits in what is left of the budget is read 32 entries at a time; any other
--   one entry at a time, and no entry is larger than the stream that holds it;
-- - an entry over the limit is parked in the dead-letter stream by its id and size (never its
--   fields), acknowledged and deleted, here, atomically.
--
-- Returns {entries, parked, touched}: entries flat as stream index, entry id, message (false
-- for an entry deleted or without one), deliveries; parked flat as stream index, entry id
-- (false for a whole stream dropped), bytes; touched the bytes of entries this call loaded.
local n = #KEYS - 1
local dead = KEYS[n + 1]
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local count, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local first, limit, cap = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local entries, parked = {}, {}
local cursor, open = {}, {}
for i = 1, n do
  cursor[i], open[i] = mode, true
end
local taken, touched, live = 0, 0, n

local function size_of(fields)
  local size = 0
  for j = 1, #fields do
    size = size + #fields[j]
  end
  return size
end

local function message_of(fields)
  for j = 1, #fields, 2 do
    if fields[j] == 'message' then
      return fields[j + 1]
    end
  end
  return false
end

local function deliveries_of(key, id)
  if mode == '>' then
    return 1
  end
  local pending = redis.call('XPENDING', key, group, id, id, 1, consumer)
  return pending[1] and pending[1][4] or 1
end

local function record(i, id, size, reason)
  local now = redis.call('TIME')
  redis.call('XADD', dead, 'MAXLEN', '~', 10000, '*',
    'message', '', 'source', KEYS[i], 'entryId', id or '', 'bytes', size, 'reason', reason,
    'parkedAt', now[1] .. '.' .. string.format('%06d', tonumber(now[2])))
  parked[#parked + 1] = i
  parked[#parked + 1] = id
  parked[#parked + 1] = size
end

local function park(i, id, size)
  record(i, id, size,
    'entry of ' .. size .. ' bytes (all fields), over the limit of ' .. limit .. ': never read')
  redis.call('XACK', KEYS[i], group, id)
  redis.call('XDEL', KEYS[i], id)
end

local function drop(i, memory)
  local length = redis.call('XLEN', KEYS[i])
  record(i, false, memory,
    'stream of ' .. memory .. ' bytes (' .. length .. ' entries), over the cap of ' .. cap ..
      ': dropped unread')
  redis.call('UNLINK', KEYS[i])
  open[i], live = false, live - 1
end

local function take(i, entry)
  local fields = entry[2] or {}
  local size = size_of(fields)
  touched = touched + size
  cursor[i] = (mode == '>') and '>' or entry[1]
  if size > limit then
    park(i, entry[1], size)
    return
  end
  entries[#entries + 1] = i
  entries[#entries + 1] = entry[1]
  entries[#entries + 1] = message_of(fields)
  entries[#entries + 1] = deliveries_of(KEYS[i], entry[1])
  taken = taken + 1
end

local function read(i)
  local memory = redis.call('MEMORY', 'USAGE', KEYS[i], 'SAMPLES', 0)
  if not memory then -- gone (dropped by another bridge, flushed): upkeep makes it again
    open[i], live = false, live - 1
    return
  end
  if memory > cap then
    return drop(i, memory)
  end
  local want = 1
  if memory <= budget - touched then
    want = math.min(32, count - taken)
  end
  local reply = redis.call(
    'XREADGROUP', 'GROUP', group, consumer, 'COUNT', want, 'STREAMS', KEYS[i], cursor[i])
  local found = (reply and reply[1] and reply[1][2]) or {}
  for _, entry in ipairs(found) do
    take(i, entry)
  end
  if #found < want then
    open[i], live = false, live - 1
  end
end

while taken < count and touched < budget and live > 0 do
  for step = 0, n - 1 do
    local i = (first - 1 + step) % n + 1
    if open[i] and taken < count and touched < budget then
      read(i)
    end
  end
end
return {entries, parked, touched}
