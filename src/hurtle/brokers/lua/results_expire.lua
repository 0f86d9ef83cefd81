--[[
  Make a hash of results (keys.result_key) live at least as long as the result just written
  to it: each result carries its own expiry (result_get.lua checks it), and the hash goes
  when the last of them does.

  Run once per hash touched by a batch, after the batch's HSET of that hash
  (redis/results.py), in the same pipeline as the acknowledgements.

  Input:
    KEYS[1]      the hash
    ARGV[1]      the longest time to live of the results just written to it, in milliseconds

  Output:
    1 when the expiry moved, else 0
]]

local ttl = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
