--[[
  Publish the units of one queue whose keys this script has not stored lately (the outbox's
  relay publishing a batch again after it died before its commit). A unit is what is stored or
  skipped whole, under one key: the messages of one outbox row in this queue, under the id of
  the first of them (a row is one write of up to 1,000 messages, never changed once written),
  or one message under its own id. The queue remembers the keys it stored in two SETs,
  generations: new keys go to the current one, and when that holds ARGV[1] keys the older one
  is dropped and the current becomes the older (so between ARGV[1] and twice as many of the
  newest keys are remembered). Keys found in either (one SMISMEMBER per CHUNK each) are
  skipped; the others' messages are stored as publish.lua stores them (ready ones at the tail of
  their priority list, delayed ones into the delayed set); then idle consumers are woken. A
  handful of commands a batch, and one set member a unit rather than a message: the batch a
  dead relay left is the last one it stored, and one relay works at a time, so its successor
  finds those keys among the newest.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     wake list
    KEYS[13]     seq counter
    KEYS[14]     prefix of the generations: KEYS[14] .. '0' and .. '1' (SETs of keys), and
                 KEYS[14] .. 'gen' (STRING: which is current); same hash tag, same slot

    ARGV[1]      keys a generation holds before the older one is dropped
    ARGV[2]      now, the caller's clock (Unix seconds): an eta after it is delayed
    ARGV[3..]    units: key, how many groups (g), then g groups of messages with one priority
                 and eta: priority (0..9), eta (Unix seconds), how many (n), then n payloads

  Output:
    the number of messages stored (the others were stored before)
]]
-- @include _lib

local keep = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local gen = redis.call('GET', KEYS[14] .. 'gen') or '0'
local current = KEYS[14] .. gen
local older = KEYS[14] .. (gen == '0' and '1' or '0')
-- per unit: its key, and where its groups start
local keys = {}
local place = {}
local at = 3
while at <= #ARGV do
  keys[#keys + 1] = ARGV[at]
  place[#keys] = at + 2
  local g = tonumber(ARGV[at + 1])
  at = at + 2
  for _ = 1, g do
    at = at + 3 + tonumber(ARGV[at + 2])
  end
end
local seen = {}
local j = 1
while j <= #keys do
  local last = math.min(j + CHUNK - 1, #keys)
  local a = redis.call('SMISMEMBER', current, unpack(keys, j, last))
  local b = redis.call('SMISMEMBER', older, unpack(keys, j, last))
  for k = 1, #a do
    seen[j + k - 1] = a[k] == 1 or b[k] == 1
  end
  j = last + 1
end

local added = {}
local taken = {}
local ready = {}
local readies = 0
local later = {}
for u = 1, #keys do
  local key = keys[u]
  if not seen[u] and not taken[key] then
    taken[key] = true
    added[#added + 1] = key
    local g = place[u]
    for _ = 1, tonumber(ARGV[g - 1]) do
      local p = tonumber(ARGV[g])
      local n = tonumber(ARGV[g + 2])
      if tonumber(ARGV[g + 1]) > now then
        for i = g + 3, g + 2 + n do
          later[#later + 1] = g
          later[#later + 1] = i
        end
      else
        local list = ready[p]
        if list == nil then
          list = {}
          ready[p] = list
        end
        for i = g + 3, g + 2 + n do
          list[#list + 1] = ARGV[i]
        end
        readies = readies + n
      end
      g = g + 3 + n
    end
  end
end
if #added == 0 then
  return 0
end
call_chunked('SADD', current, added)
if redis.call('SCARD', current) >= keep then
  redis.call('DEL', older)
  redis.call('SET', KEYS[14] .. 'gen', gen == '0' and '1' or '0')
end

for p, list in pairs(ready) do
  call_chunked('RPUSH', KEYS[p + 1], list)
end

local delayed = #later / 2
if delayed > 0 then
  -- Members carry priority and a sequence number, so equal payloads stay distinct.
  local seq = redis.call('INCRBY', KEYS[13], delayed) - delayed
  local args = {}
  for k = 1, #later, 2 do
    local g = later[k]
    seq = seq + 1
    args[#args + 1] = ARGV[g + 1]
    args[#args + 1] = ARGV[g] .. string.format(':%012x:', seq) .. ARGV[later[k + 1]]
  end
  call_chunked('ZADD', KEYS[11], args)
end

wake_for(KEYS[12], readies, delayed)
return readies + delayed
