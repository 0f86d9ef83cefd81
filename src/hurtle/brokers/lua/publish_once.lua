--[[
  Publish the messages of one queue whose ids this script has not stored lately (the outbox's
  relay publishing a batch again after it died before its commit): the queue remembers the ids
  it stored in two SETs, generations: new ids go to the current one, and when that holds
  ARGV[1] ids the older one is dropped and the current becomes the older (so between ARGV[1]
  and twice as many of the newest ids are remembered). Ids found in either (one SMISMEMBER per
  CHUNK each) are skipped; the others are stored as publish.lua stores them (ready ones at the
  tail of their priority list, delayed ones into the delayed set); then idle consumers are
  woken. A handful of commands a batch, whatever its size, and bounded memory: the batch a dead
  relay left is the last one it stored, and one relay works at a time, so its successor finds
  those ids among the newest.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     wake list
    KEYS[13]     seq counter
    KEYS[14]     prefix of the generations: KEYS[14] .. '0' and .. '1' (SETs of ids), and
                 KEYS[14] .. 'gen' (STRING: which is current); same hash tag, same slot

    ARGV[1]      ids a generation holds before the older one is dropped
    ARGV[2]      now, the caller's clock (Unix seconds): an eta after it is delayed
    ARGV[3..]    groups of messages with one priority and eta: priority (0..9), eta (Unix
                 seconds), how many (n), then n pairs: id, payload

  Output:
    the number of messages stored (the others were stored before)
]]
-- @include _lib

local keep = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local gen = redis.call('GET', KEYS[14] .. 'gen') or '0'
local current = KEYS[14] .. gen
local older = KEYS[14] .. (gen == '0' and '1' or '0')
-- per message: its id, and where its group's priority, eta and its payload are
local ids = {}
local group = {}
local place = {}
local at = 3
while at <= #ARGV do
  local n = tonumber(ARGV[at + 2])
  for k = 0, n - 1 do
    local i = at + 3 + 2 * k
    ids[#ids + 1] = ARGV[i]
    group[#ids] = at
    place[#ids] = i + 1
  end
  at = at + 3 + 2 * n
end
local seen = {}
local j = 1
while j <= #ids do
  local last = math.min(j + CHUNK - 1, #ids)
  local a = redis.call('SMISMEMBER', current, unpack(ids, j, last))
  local b = redis.call('SMISMEMBER', older, unpack(ids, j, last))
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
for m = 1, #ids do
  local id = ids[m]
  if not seen[m] and not taken[id] then
    taken[id] = true
    added[#added + 1] = id
    local g = group[m]
    local p = tonumber(ARGV[g])
    if tonumber(ARGV[g + 1]) > now then
      later[#later + 1] = m
    else
      local list = ready[p]
      if list == nil then
        list = {}
        ready[p] = list
      end
      list[#list + 1] = ARGV[place[m]]
      readies = readies + 1
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

local delayed = #later
if delayed > 0 then
  -- Members carry priority and a sequence number, so equal payloads stay distinct.
  local seq = redis.call('INCRBY', KEYS[13], delayed) - delayed
  local args = {}
  for _, m in ipairs(later) do
    local g = group[m]
    seq = seq + 1
    args[#args + 1] = ARGV[g + 1]
    args[#args + 1] = ARGV[g] .. string.format(':%012x:', seq) .. ARGV[place[m]]
  end
  call_chunked('ZADD', KEYS[11], args)
end

wake_for(KEYS[12], readies, delayed)
return readies + delayed
