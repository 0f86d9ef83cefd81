--[[
  End unique locks of one queue, each only while it still holds the id of the message whose
  outcome is settled (a lock that expired and was taken by another message is left alone).

  Input:
    KEYS[1..n]  the locks
    ARGV[1..n]  the id each must hold to be released

  Output:
    how many were released
]]

local released = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
return released
