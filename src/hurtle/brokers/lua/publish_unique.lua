--[[
  Publish the messages of one queue that can take their unique lock: a lock is a key holding
  the id of the message that took it, for ARGV[1] ms or until released (``unique_release``).
  A message whose lock is held (by an earlier message, or one earlier in this batch) is not
  stored; the id holding its lock is returned for it instead.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     wake list
    KEYS[13]     seq counter
    KEYS[14..]   the lock of each message, in order

    ARGV[1]      how long a lock is held, in milliseconds
    ARGV[2..]    per message: id, priority (0..9), eta (Unix seconds; 0 = now), payload

  Output:
    flat { index (1-based), id holding its lock } for each message that was not stored
]]
-- @include _lib

local now = server_now()
local ttl = ARGV[1]
local ready = {}
local delayed = {}
local skipped = {}
local n = #KEYS - 13
for i = 1, n do
  local at = 2 + (i - 1) * 4
  local lock = KEYS[13 + i]
  if redis.call('SET', lock, ARGV[at], 'NX', 'PX', ttl) then
    local priority = tonumber(ARGV[at + 1])
    local eta = tonumber(ARGV[at + 2])
    if eta > now then
      delayed[#delayed + 1] = { eta, ARGV[at + 1], ARGV[at + 3] }
    else
      local list = ready[priority + 1]
      if not list then
        list = {}
        ready[priority + 1] = list
      end
      list[#list + 1] = ARGV[at + 3]
    end
  else
    skipped[#skipped + 1] = i
    skipped[#skipped + 1] = redis.call('GET', lock)
  end
end
local stored = 0
for p = 0, 9 do
  local list = ready[p + 1]
  if list then
    call_chunked('RPUSH', KEYS[p + 1], list)
    stored = stored + #list
  end
end
if #delayed > 0 then
  local seq = redis.call('INCRBY', KEYS[13], #delayed) - #delayed
  for _, d in ipairs(delayed) do
    seq = seq + 1
    redis.call('ZADD', KEYS[11], d[1], d[2] .. string.format(':%012x:', seq) .. d[3])
  end
end
local tokens = math.min(stored, MAX_TOKENS)
if tokens == 0 and #delayed > 0 then
  tokens = 1
end
if tokens > 0 then
  local t = {}
  for i = 1, tokens do
    t[i] = '1'
  end
  redis.call('RPUSH', KEYS[12], unpack(t))
  redis.call('LTRIM', KEYS[12], -MAX_TOKENS, -1)
end
return skipped
