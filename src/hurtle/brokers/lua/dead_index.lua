--[[
  Apply changes to the index of dead letters by message id that queue scripts could not make
  themselves (a Redis Cluster, where the index has a slot of its own; see _lib.lua).

  Input:
    KEYS[1]      the index (keys.DEAD_INDEX: message id -> queue .. '\31' .. dead-letter id)

    ARGV         triples: '+' or '-', message id, entry. '+' sets the entry; '-' removes it
                 only while it is that entry (a later dead letter of the message keeps its own)

  Output:
    nothing
]]

for i = 1, #ARGV, 3 do
  if ARGV[i] == '+' then
    redis.call('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2])
  elseif redis.call('HGET', KEYS[1], ARGV[i + 1]) == ARGV[i + 2] then
    redis.call('HDEL', KEYS[1], ARGV[i + 1])
  end
end
return nil
