--[[
  Publish a batch of messages to one queue: ready ones at the tail of their priority list,
  delayed ones into the delayed set; then wake idle consumers.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     wake list
    KEYS[13]     seq counter

    ARGV[1..10]  how many ready payloads of priority 0..9 follow
    ARGV[11..]   the ready payloads, grouped by priority, lowest priority first;
                 then (eta, priority, payload) triples for delayed messages

  Output:
    the number of messages stored

  Payloads are opaque bytes: nothing here decodes them.
]]
-- @include _lib

local at = 11
local ready = 0
for p = 0, 9 do
  local n = tonumber(ARGV[p + 1])
  if n > 0 then
    local i = at
    local last = at + n - 1
    while i <= last do
      local j = math.min(i + CHUNK - 1, last)
      redis.call('RPUSH', KEYS[p + 1], unpack(ARGV, i, j))
      i = j + 1
    end
    at = at + n
    ready = ready + n
  end
end

local delayed = (#ARGV - at + 1) / 3
if delayed > 0 then
  -- Members carry priority and a sequence number, so equal payloads stay distinct.
  local seq = redis.call('INCRBY', KEYS[13], delayed) - delayed
  local args = {}
  for i = 0, delayed - 1 do
    local k = at + 3 * i
    seq = seq + 1
    args[#args + 1] = ARGV[k]
    args[#args + 1] = ARGV[k + 1] .. string.format(':%012x:', seq) .. ARGV[k + 2]
  end
  call_chunked('ZADD', KEYS[11], args)
end

wake_for(KEYS[12], ready, delayed)
return ready + delayed
