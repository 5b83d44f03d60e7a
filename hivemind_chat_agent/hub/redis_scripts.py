"""The Lua the Redis store runs, so that a client's bounds hold across every replica sharing
the store and each turn still costs one round trip as it begins and one as it ends.

Per client (its fingerprint, core/satellites.client_fingerprint; "" for none, which is under
no session cap):
    sessions:<client>   sorted set: the client's engine session ids, scored by their last turn
                        (Redis' own clock, so replicas' clocks do not matter)
    turns:<client>      sorted set: the client's turn records ("<n>:<session>:<turn id>", as
                        in their key), scored by their last write
A session beyond `max_sessions_per_client` (the least recently used) goes with its history, its
Session and its finished turn records; a running record stays until its turn ends, for the same
reason as below. A new turn record beyond `max_turn_records_per_client` makes room with the
client's own oldest finished record; when every one is running, the claim is refused (-1), and
the plugin answers that turn "busy" rather than let a running turn be run twice.
"""

# shared by the scripts: ARGV[1] is the key prefix
_COMMON = """
if redis.replicate_commands then redis.replicate_commands() end   -- Redis < 5: TIME, writes
local prefix = ARGV[1]
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end
local function running(raw)
  if not raw then return false end
  local ok, record = pcall(cjson.decode, raw)
  return ok and type(record) == 'table' and record.state == 'running'
end
local function drop_record(turns, member)
  redis.call('DEL', prefix .. 'turn:' .. member)
  redis.call('ZREM', turns, member)
end
-- a record of `client` is started unless there is one; 1 started, 0 there is one, -1 full
local function claim(turns, member, record, record_ttl, cap, t)
  local key = prefix .. 'turn:' .. member
  if redis.call('EXISTS', key) == 1 then return 0 end
  local over = redis.call('ZCARD', turns) - cap + 1
  if over > 0 then          -- those that lapsed with their key first
    redis.call('ZREMRANGEBYSCORE', turns, '-inf', t - record_ttl)
    over = redis.call('ZCARD', turns) - cap + 1
  end
  local kept = 0             -- running records at the front, skipped (never dropped)
  while over > 0 do          -- oldest first, a few at a time: the oldest is usually done
    local batch = redis.call('ZRANGE', turns, kept, kept + 7)
    if #batch == 0 then return -1 end
    for _, old in ipairs(batch) do
      if over <= 0 then break end
      if running(redis.call('GET', prefix .. 'turn:' .. old)) then
        kept = kept + 1
      else
        drop_record(turns, old)
        over = over - 1
      end
    end
  end
  redis.call('SET', key, record, 'EX', record_ttl)
  redis.call('ZADD', turns, t, member)
  redis.call('EXPIRE', turns, record_ttl)
  return 1
end
"""

# KEYS: sessions:<client>, turns:<client>
# ARGV: prefix, session id, session ttl, max sessions (0: no cap), read history (0/1),
#       turn member ("" for none), running record JSON, record ttl, max turn records
BEGIN = _COMMON + """
local sessions, turns = KEYS[1], KEYS[2]
local sid, ttl, cap = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local t = now()
if cap > 0 then
  redis.call('ZADD', sessions, t, sid)
  redis.call('EXPIRE', sessions, ttl)
  local over = redis.call('ZCARD', sessions) - cap
  if over > 0 then          -- those whose keys expired first
    redis.call('ZREMRANGEBYSCORE', sessions, '-inf', t - ttl)
    over = redis.call('ZCARD', sessions) - cap
  end
  if over > 0 then
    local gone = {}
    for _, old in ipairs(redis.call('ZRANGE', sessions, 0, over - 1)) do
      redis.call('DEL', prefix .. 'history:' .. old, prefix .. 'session:' .. old)
      gone[string.len(old) .. ':' .. old .. ':'] = true
    end
    redis.call('ZREMRANGEBYRANK', sessions, 0, over - 1)
    for _, member in ipairs(redis.call('ZRANGE', turns, 0, -1)) do
      local head = string.match(member, '^%d+:')
      local n = head and tonumber(string.sub(head, 1, -2))
      if n and gone[string.sub(member, 1, string.len(head) + n + 1)]
          and not running(redis.call('GET', prefix .. 'turn:' .. member)) then
        drop_record(turns, member)
      end
    end
  end
end
local session = redis.call('GET', prefix .. 'session:' .. sid)
local history = {}
if ARGV[5] == '1' then history = redis.call('LRANGE', prefix .. 'history:' .. sid, 0, -1) end
local claimed = 1
if ARGV[6] ~= '' then
  claimed = claim(turns, ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), t)
end
return {session, history, claimed}
"""

# KEYS: turns:<client>
# ARGV: prefix, turn member, running record JSON, record ttl, max turn records
CLAIM = _COMMON + """
return claim(KEYS[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now())
"""

# KEYS: sessions:<client>, turns:<client>
# ARGV: prefix, session id, the client has a session cap (0/1), session ttl,
#       exchange JSON ("" for none), how many of the oldest to trim, turn member ("" for none),
#       done record JSON, record ttl
# The exchange is kept only while the session is still the client's (a turn that outlived
# its session's eviction does not bring it back); the record is done either way.
FINISH = _COMMON + """
local sessions, turns = KEYS[1], KEYS[2]
local sid, ttl = ARGV[2], tonumber(ARGV[4])
if ARGV[5] ~= '' and (ARGV[3] == '0' or redis.call('ZSCORE', sessions, sid)) then
  local history = prefix .. 'history:' .. sid
  redis.call('RPUSH', history, ARGV[5])
  local drop = tonumber(ARGV[6])
  if drop > 0 then redis.call('LTRIM', history, drop, -1) end
  redis.call('EXPIRE', history, ttl)
end
if ARGV[7] ~= '' then
  local record_ttl = tonumber(ARGV[9])
  redis.call('SET', prefix .. 'turn:' .. ARGV[7], ARGV[8], 'EX', record_ttl)
  redis.call('ZADD', turns, now(), ARGV[7])   -- (the claim renewed the set's own TTL)
end
return 1
"""

# KEYS: sessions:<client>
# ARGV: prefix, session id, the client has a session cap (0/1), session ttl, Session JSON
KEEP_SESSION = _COMMON + """
if ARGV[3] == '0' or redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('SET', prefix .. 'session:' .. ARGV[2], ARGV[5], 'EX', tonumber(ARGV[4]))
end
return 1
"""
