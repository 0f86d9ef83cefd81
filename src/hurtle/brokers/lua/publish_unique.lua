--[[
  Publish the messages of one queue that can take their unique lock. A lock is a field of the
  queue's unique hash, its value the id of the message holding it and when it ends
  (id '@' Unix seconds: the message's headers["unique_until"], else the server's now plus
  ARGV[1]); it is held until then or until released (``unique_release``, or a plain HDEL by a
  worker that knows the lock cannot have passed to another message). A message whose lock is held (by an
  earlier message, or one earlier in this batch) is not stored; the id holding its lock is
  returned for it instead. Reads and writes of the locks are one bulk command each (per CHUNK),
  not one command per message. Each call looks at more locks (HSCAN, from the cursor where
  the last call stopped; as many as it publishes, at least SWEEP_LEAST) and drops those
  that expired: the sweep costs per message, and keeps ahead of the locks that are added.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     wake list
    KEYS[13]     seq counter
    KEYS[14]     unique hash (lock -> message id '@' when the lock ends, server seconds)
    KEYS[15]     the sweep's HSCAN cursor (STRING)

    ARGV[1]      how long a lock is held, in seconds
    ARGV[2]      priority of these messages (0..9)
    ARGV[3]      their eta (Unix seconds; 0 = now)
    ARGV[4..]    per message: lock, id, payload, when its lock ends ('' = ARGV[1] from now)

  Output:
    flat { index (1-based), id holding its lock } for each message that was not stored
]]
-- @include _lib

local SWEEP_LEAST = 64
local now = server_now()
local ends = string.format('@%.3f', now + tonumber(ARGV[1]))
local n = (#ARGV - 3) / 4

-- a bounded sweep of expired locks, from where the last one stopped
local cursor = redis.call('GET', KEYS[15]) or '0'
local scan = redis.call('HSCAN', KEYS[14], cursor, 'COUNT', math.max(SWEEP_LEAST, n))
local expired = {}
local found = scan[2]
for k = 1, #found, 2 do
  local value = found[k + 1]
  if tonumber(string.sub(value, string.find(value, '@', 1, true) + 1)) <= now then
    expired[#expired + 1] = found[k]
  end
end
call_chunked('HDEL', KEYS[14], expired)
redis.call('SET', KEYS[15], scan[1])

local priority = tonumber(ARGV[2])
local eta = tonumber(ARGV[3])
local locks = {}
for i = 1, n do
  locks[i] = ARGV[i * 4]
end
-- the holder of every lock (id '@' end)
local holders = hmget_chunked(KEYS[14], locks, n)

-- (counters rather than #t: the length of a Lua table is a search, not a field)
local taken = {}  -- lock -> id, for locks taken in this batch
local fields, stored, skipped = {}, {}, {}
local nf, ns, nskip = 0, 0, 0
for m = 1, n do
  local lock = locks[m]
  local holder = taken[lock]
  local value = holders[m]
  if not holder and value then
    local at = string.find(value, '@', 1, true)
    if tonumber(string.sub(value, at + 1)) > now then
      holder = string.sub(value, 1, at - 1)
    end
  end
  if holder then
    skipped[nskip + 1] = m
    skipped[nskip + 2] = holder
    nskip = nskip + 2
  else
    local id = ARGV[1 + m * 4]
    local lock_end = ARGV[3 + m * 4]
    taken[lock] = id
    fields[nf + 1] = lock
    fields[nf + 2] = id .. (lock_end ~= '' and ('@' .. lock_end) or ends)
    nf = nf + 2
    ns = ns + 1
    stored[ns] = ARGV[2 + m * 4]
  end
end
call_chunked('HSET', KEYS[14], fields)

local ready = 0
if #stored > 0 and eta > now then
  -- members carry priority and a sequence number, as publish.lua writes them
  local seq = redis.call('INCRBY', KEYS[13], #stored) - #stored
  local members = {}
  for _, payload in ipairs(stored) do
    seq = seq + 1
    members[#members + 1] = eta
    members[#members + 1] = ARGV[2] .. string.format(':%012x:', seq) .. payload
  end
  call_chunked('ZADD', KEYS[11], members)
elseif #stored > 0 then
  call_chunked('RPUSH', KEYS[priority + 1], stored)
  ready = #stored
end
wake_for(KEYS[12], ready, #stored - ready)
return skipped
