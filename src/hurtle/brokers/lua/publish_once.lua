--[[
  Publish the messages of one queue whose ids this script has not stored before (the outbox's
  relay publishing a batch again after it died before deleting it): per message, SET NX with a
  ttl on a marker key of its id; a message whose marker was there already is skipped, the
  others are stored as publish.lua stores them (ready ones at the tail of their priority list,
  delayed ones into the delayed set), then idle consumers are woken.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     wake list
    KEYS[13]     seq counter
    KEYS[14]     prefix of the markers: KEYS[14] .. id (same hash tag, so same slot)

    ARGV[1]      seconds a marker is kept (whole seconds)
    ARGV[2]      now, the caller's clock (Unix seconds): an eta after it is delayed
    ARGV[3..]    per message: id, priority (0..9), eta (Unix seconds), payload

  Output:
    the number of messages stored (the others were stored before)
]]
-- @include _lib

local ttl = ARGV[1]
local now = tonumber(ARGV[2])
local ready = {}
local readies = 0
local later = {}
for i = 3, #ARGV, 4 do
  if redis.call('SET', KEYS[14] .. ARGV[i], '1', 'NX', 'EX', ttl) then
    local p = tonumber(ARGV[i + 1])
    if tonumber(ARGV[i + 2]) > now then
      later[#later + 1] = i
    else
      local list = ready[p]
      if list == nil then
        list = {}
        ready[p] = list
      end
      list[#list + 1] = ARGV[i + 3]
      readies = readies + 1
    end
  end
end

for p, list in pairs(ready) do
  call_chunked('RPUSH', KEYS[p + 1], list)
end

local delayed = #later
if delayed > 0 then
  -- Members carry priority and a sequence number, so equal payloads stay distinct.
  local seq = redis.call('INCRBY', KEYS[13], delayed) - delayed
  local args = {}
  for _, i in ipairs(later) do
    seq = seq + 1
    args[#args + 1] = ARGV[i + 2]
    args[#args + 1] = ARGV[i + 1] .. string.format(':%012x:', seq) .. ARGV[i + 3]
    if #args >= CHUNK then
      redis.call('ZADD', KEYS[11], unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', KEYS[11], unpack(args))
  end
end

wake_for(KEYS[12], readies, delayed)
return readies + delayed
