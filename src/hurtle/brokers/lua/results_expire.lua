--[[
  Make a hash of results (keys.result_key) live at least as long as the results about to be
  written to it: each result carries its own expiry (result_get.lua checks it), and the hash
  goes when the last of them does.

  Run once per hash touched by a batch, just before the batch's HSET of that hash
  (redis/results.py), in the same pipeline as the acknowledgements, sent whole (EVAL, not
  EVALSHA): it runs in its place even when the server has forgotten its scripts. A hash that
  does not exist yet is made here with a placeholder, the empty field holding the empty string
  (result_get.lua reads it as no result; a record stored under that field replaces it), so
  that the hash has its expiry before any record is in it: a worker killed between the two
  commands, or a connection cut there, leaves a hash that goes away by itself, never one that
  stays for good.

  Input:
    KEYS[1]      the hash
    ARGV[1]      the longest time to live of the results about to be written, in milliseconds

  Output:
    1 when the expiry moved, else 0
]]

local ttl = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], '', '')
end
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return 1
end
return 0
