--[[
  Publish one channel frame, numbered by the channel's count: the count goes up by the frame's
  messages and the frame goes out with the count's epoch and the number of its first message
  appended (two msgpack integers, completing the array the publisher began; see
  channels/frame.py). Numbering and publishing in one script, a channel's subscribers receive its
  frames in number order, whichever publisher sent them.

  Input:
    KEYS[1]  the channel's pub/sub name, which also names its count: a HASH, n = messages
             published, e = the epoch (server microseconds when the count began). On a cluster
             key and channel are the same string, so the count lives in the channel's slot.

    ARGV[1]  messages in the frame (0 for an empty frame: a publisher's tail, a feed's mark)
    ARGV[2]  the frame, less its last two elements
    ARGV[3]  seconds the count is kept after its last frame
    ARGV[4]  "1" on a cluster (SPUBLISH: sharded pub/sub), else "0" (PUBLISH)

  Output:
    the number of subscribers that received the frame
]]

local size = tonumber(ARGV[1])
local total = redis.call('HINCRBY', KEYS[1], 'n', size)
local epoch = redis.call('HGET', KEYS[1], 'e')
if not epoch then
  local now = redis.call('TIME')
  epoch = now[1] .. string.format('%06d', now[2])
  redis.call('HSET', KEYS[1], 'e', epoch)
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
local verb = ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH'
return redis.call(verb, KEYS[1], ARGV[2] .. cmsgpack.pack(tonumber(epoch), total - size))
