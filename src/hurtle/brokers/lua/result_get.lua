--[[
  Read one stored result (redis/results.py): its payload, or nil when there is none or it expired.

  Input:
    KEYS[1]  the hash that holds it (keys.result_key)
    ARGV[1]  the message id

  Output:
    the payload, or nil
]]

local value = redis.call('HGET', KEYS[1], ARGV[1])
if not value or string.len(value) < 13 then  -- none, or results_expire.lua's placeholder
  return false
end
local t = redis.call('TIME')
if tonumber(string.sub(value, 1, 13)) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
  return false
end
return string.sub(value, 14)
