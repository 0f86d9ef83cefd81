--[[
  End unique locks of one queue, each only while it still holds the id of the message whose
  outcome is settled (a lock that expired and was taken by another message is left alone).
  The locks come in a few packed strings rather than two arguments per lock.

  Input:
    KEYS[1]     unique hash (lock -> message id '@' when it ends)

    ARGV[1]     the locks, concatenated
    ARGV[2]     the ids they must hold to be released, concatenated
    ARGV[3]     per lock, the lengths of the lock and of the id: two little-endian uint32s

  Output:
    how many were released
]]
-- @include _lib

local packed_locks, packed_ids, lengths = ARGV[1], ARGV[2], ARGV[3]
local n = #lengths / 8
local locks = {}
local ids = {}
local at_lock, at_id, pos = 1, 1, 1
for i = 1, n do
  local lock_len, id_len
  lock_len, id_len, pos = struct.unpack('<I4I4', lengths, pos)
  locks[i] = string.sub(packed_locks, at_lock, at_lock + lock_len - 1)
  ids[i] = string.sub(packed_ids, at_id, at_id + id_len - 1)
  at_lock = at_lock + lock_len
  at_id = at_id + id_len
end
local holders = hmget_chunked(KEYS[1], locks, n)
local gone = {}
for i = 1, n do
  local value = holders[i]
  local id = ids[i]
  -- held by this id: the value is the id, '@', when it ends
  if value and string.byte(value, #id + 1) == 64 and string.sub(value, 1, #id) == id then
    gone[#gone + 1] = locks[i]
  end
end
call_chunked('HDEL', KEYS[1], gone)
return #gone
