-- Take over, for the ack bridge in the celery mode, the entries of the ack streams in
-- KEYS[1..n] that were relayed to a worker and not settled in time (their task lost by the
-- broker, their worker killed, their bridge dead before it relayed them): each entry's time is
-- the relay timeout doubled with each delivery it had, up to a cap. The entries are claimed
-- (XCLAIM: their deliveries counted, their idle time reset, so no other bridge takes them too)
-- and returned, bounded in count and in bytes: what does not fit waits for the next call.
--
-- ARGV: group, consumer, relay timeout (ms), cap (ms), most entries, most bytes, the stream to
--       start from (1-based; turns round for fairness), pending entries looked at per stream.
-- Returns entries flat as stream index, entry id, message (false for one without), deliveries.
local n = #KEYS
local group, consumer = ARGV[1], ARGV[2]
local base, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local count, budget, first = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local looked = tonumber(ARGV[8])
local entries, taken, loaded = {}, 0, 0

local function due(deliveries)
  return math.min(base * 2 ^ (math.min(deliveries, 30) - 1), cap)
end

local function message_of(fields)
  for j = 1, #fields, 2 do
    if fields[j] == 'message' then
      return fields[j + 1]
    end
  end
  return false
end

local function size_of(fields)
  local size = 0
  for j = 1, #fields do
    size = size + #fields[j]
  end
  return size
end

local function take(i, id, deliveries)
  local key = KEYS[i]
  local found = redis.call('XRANGE', key, id, id)
  if #found == 0 then -- deleted (trimmed, or settled by a worker between): nothing to relay
    redis.call('XACK', key, group, id)
    return true
  end
  local fields = found[1][2]
  local size = size_of(fields)
  if taken > 0 and loaded + size > budget then
    return false
  end
  -- the relay about to be made counted as one more delivery
  local wait = math.floor(due(deliveries))
  local claimed = redis.call(
    'XCLAIM', key, group, consumer, wait, id, 'RETRYCOUNT', deliveries + 1, 'JUSTID')
  if #claimed == 0 then
    return true
  end
  loaded, taken = loaded + size, taken + 1
  entries[#entries + 1] = i
  entries[#entries + 1] = id
  entries[#entries + 1] = message_of(fields)
  entries[#entries + 1] = deliveries + 1
  return true
end

for step = 0, n - 1 do
  local i = (first - 1 + step) % n + 1
  if taken >= count then
    break
  end
  local pending = redis.call('XPENDING', KEYS[i], group, 'IDLE', base, '-', '+', looked)
  for _, row in ipairs(pending) do
    if taken >= count then
      break
    end
    local id, idle, deliveries = row[1], row[3], row[4]
    if idle >= due(deliveries) and not take(i, id, deliveries) then
      break
    end
  end
end
return entries
