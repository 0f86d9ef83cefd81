--[[
  Read one stored result (redis/results.py): its record, or where it is in a batch stored whole,
  or nil when there is none or it expired.

  A batch (a field of the bucket's hash of batches, named by the first and the last id of it in
  the bucket, space-separated) holds records of calls that returned: nothing follows those, so
  one found in a batch wins over a record stored on its own (a failed attempt's). Its value: the
  13-digit expiry, 8 digits giving the length of the ids that follow, the batch's ids
  space-separated, then the batch (middleware/results.py, Batch). The ids of one bucket differ
  only in their last 3 bytes, which are compared as numbers (Lua's string comparison follows
  the server's locale).

  Input:
    KEYS[1]  the hash that holds records one by one (keys.result_key)
    KEYS[2]  the hash of the bucket's batches (keys.result_batches_key)
    ARGV[1]  the message id
    ARGV[2]  keys.RESULT_BUCKET_CUT

  Output:
    the record; or {the batch's value, the id's place in it (from 0), where its body starts
    (from 1)}; or nil
]]

local id = ARGV[1]
local n = string.len(id)
local from = n - 2  -- ids of a bucket differ in their last three bytes (keys.RESULT_BUCKET_CUT)
if ARGV[2] ~= '3' then
  return redis.error_reply('result_get.lua compares the last 3 bytes of ids, not ' .. ARGV[2])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function tail(s, first)  -- bytes first to first + 2 of s, as one number
  local a, b, c = string.byte(s, first, first + 2)
  return (a * 256 + b) * 256 + c
end

if from > 1 then
  local mine = tail(id, from)
  for _, field in ipairs(redis.call('HKEYS', KEYS[2])) do
    if string.len(field) == 2 * n + 1 and tail(field, from) <= mine
        and mine <= tail(field, n + 1 + from) then
      local value = redis.call('HGET', KEYS[2], field)
      if tonumber(string.sub(value, 1, 13)) > now then
        local size = tonumber(string.sub(value, 14, 21))
        local at = string.find(value, id, 22, true)
        if at and at + n <= 22 + size and (at - 22) % (n + 1) == 0 then
          return {value, (at - 22) / (n + 1), 22 + size}  -- the body: bytes 22 + size on
        end
      end
    end
  end
end

local value = redis.call('HGET', KEYS[1], id)
if not value or string.len(value) < 13 then  -- none, or results_expire.lua's placeholder
  return false
end
if tonumber(string.sub(value, 1, 13)) <= now then
  return false
end
return string.sub(value, 14)
