-- Read a batch for the ack bridge from every ack stream in KEYS, without ever sending a large
-- entry whole: each message is cut to the payload limit (+1 byte, so that it is still refused as
-- oversized) here, inside Redis.
--
-- ARGV: group, consumer, mode ('>' new entries, '0' this consumer's pending ones), most entries,
--       most bytes, the stream to start from (1-based; turns round for fairness), payload limit.
-- Streams are read a chunk at a time, round robin, until the count or the byte budget is
-- reached, so an agent that floods its own stream gets its share of a batch and no more.
--
-- Returns {entries, last}: entries flat as stream index, entry id, message (false for an entry
-- deleted or without one), deliveries; last[i] the group's last delivered id of stream i when
-- that stream had nothing more to give (what a blocking XREAD waits beyond), else false.
local group, consumer, mode = ARGV[1], ARGV[2], ARGV[3]
local count, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local first, limit = tonumber(ARGV[6]), tonumber(ARGV[7])
local n = #KEYS
local entries, last = {}, {}
local cursor, open = {}, {}
for i = 1, n do
  cursor[i], open[i], last[i] = mode, true, false
end
local taken, bytes, live = 0, 0, n

local function message_of(fields)
  if not fields then
    return false
  end
  for j = 1, #fields, 2 do
    if fields[j] == 'message' then
      return string.sub(fields[j + 1], 1, limit + 1)
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

local function last_delivered(key)
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local name, id
    for j = 1, #info, 2 do
      if info[j] == 'name' then name = info[j + 1] end
      if info[j] == 'last-delivered-id' then id = info[j + 1] end
    end
    if name == group then
      return id
    end
  end
  return false
end

while taken < count and bytes < budget and live > 0 do
  for step = 0, n - 1 do
    local i = (first - 1 + step) % n + 1
    if open[i] and taken < count and bytes < budget then
      local want = math.min(32, count - taken)
      local reply = redis.call(
        'XREADGROUP', 'GROUP', group, consumer, 'COUNT', want, 'STREAMS', KEYS[i], cursor[i])
      local found = (reply and reply[1] and reply[1][2]) or {}
      for _, entry in ipairs(found) do
        local message = message_of(entry[2])
        entries[#entries + 1] = i
        entries[#entries + 1] = entry[1]
        entries[#entries + 1] = message
        entries[#entries + 1] = deliveries_of(KEYS[i], entry[1])
        taken = taken + 1
        bytes = bytes + (message and #message or 0)
        cursor[i] = (mode == '>') and '>' or entry[1]
      end
      if #found < want then
        open[i], live = false, live - 1
        if mode == '>' then
          last[i] = last_delivered(KEYS[i])
        end
      end
    end
  end
end
return {entries, last}
