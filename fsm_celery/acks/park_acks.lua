-- Park relayed ack stream entries in the dead-letter stream, each at most once: an entry is
-- parked only if it was still pending in the bridges' group (XACK acknowledged it here), so a
-- copy of it relayed again, given up on by another worker too, is not parked twice; and it is
-- acknowledged, deleted and parked in one step.
--
-- KEYS: the dead-letter stream, then each entry's stream.
-- ARGV: group, the dead-letter stream's length (approximate), parked at, then per entry: its
--       entry id, message, source, reason.
-- Returns how many were parked.
local group, maxlen, at = ARGV[1], ARGV[2], ARGV[3]
local parked = 0
for i = 2, #KEYS do
  local base = 4 + (i - 2) * 4
  local id = ARGV[base]
  if redis.call('XACK', KEYS[i], group, id) == 1 then
    redis.call('XDEL', KEYS[i], id)
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'message', ARGV[base + 1],
      'source', ARGV[base + 2], 'reason', ARGV[base + 3], 'parkedAt', at)
    parked = parked + 1
  end
end
return parked
