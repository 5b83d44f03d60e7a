"""The Lua the Redis store runs when a client is over one of its bounds, so that they hold
across every replica sharing the store. A turn's own begin and end are plain commands in one
round trip each (hub/redis_store.py): a script call costs Redis more than its commands, which
bench_store.py saw past its target when every turn ran two
(docs/performance.md#why-the-code-is-as-it-is).

Per client (its fingerprint, core/satellites.client_fingerprint; "" for none, which is under
no session cap):
    sessions:<client>   sorted set: the client's engine session ids, scored by their last turn
                        (the hub's clock: replicas' clocks differ by far less than a session
                        lasts)
    turns:<client>      sorted set: the client's turn records ("<n>:<session>:<turn id>", as
                        in their key), scored by their claim
A session beyond `max_sessions_per_client` (the least recently used) goes with its history, its
Session and its finished turn records; a running record stays until its turn ends, for the same
reason as below. A new turn record beyond `max_turn_records_per_client` makes room with the
client's own oldest finished records, dropped as a turn ends (off the next turn's path: a
sixteenth of the cap at a time, so that the next claims fit); when every one is running, the
claim is undone and refused (-1), and the plugin answers that turn "busy" rather than let a
running turn be run twice.

On a Redis Cluster every key a script touches, those it names from ARGV[1] too, carries the
hash tag of its KEYS (ARGV[1] is the tagged prefix, hub/redis_keys.py), so a script runs on
one node.
"""

# shared by the scripts: ARGV[1] is the key prefix
_COMMON = """
local prefix = ARGV[1]
local function running(raw)
  if not raw then return false end
  local ok, record = pcall(cjson.decode, raw)
  return ok and type(record) == 'table' and record.state == 'running'
end
local function drop_record(turns, member)
  redis.call('DEL', prefix .. 'turn:' .. member)
  redis.call('ZREM', turns, member)
end
"""

# KEYS: turns:<client>
# ARGV: prefix, how many records to leave at most, record ttl, now, the member just claimed
#       ("" when trimming after a turn)
# Returns 1 when the client is within that number again, -1 when only running records (and
# the one just claimed) are left: that claim is undone.
MAKE_ROOM = _COMMON + """
local turns, cap = KEYS[1], tonumber(ARGV[2])
local mine = ARGV[5]
local over = redis.call('ZCARD', turns) - cap
if over > 0 then          -- those that lapsed with their key first
  redis.call('ZREMRANGEBYSCORE', turns, '-inf', tonumber(ARGV[4]) - tonumber(ARGV[3]))
  over = redis.call('ZCARD', turns) - cap
end
local kept = 0             -- running records at the front, skipped (never dropped)
while over > 0 do          -- oldest first, a few at a time: the oldest is usually done
  local batch = redis.call('ZRANGE', turns, kept, kept + 7)
  if #batch == 0 then break end
  for _, old in ipairs(batch) do
    if over <= 0 then break end
    if old == mine or running(redis.call('GET', prefix .. 'turn:' .. old)) then
      kept = kept + 1
    else
      drop_record(turns, old)
      over = over - 1
    end
  end
end
if over > 0 then
  if mine ~= '' then drop_record(turns, mine) end
  return -1
end
return 1
"""

# KEYS: sessions:<client>, turns:<client>
# ARGV: prefix, max sessions, session ttl, now
# Returns how many sessions went (with their history, Session and finished turn records).
EVICT_SESSIONS = _COMMON + """
local sessions, turns = KEYS[1], KEYS[2]
local cap, ttl, t = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local over = redis.call('ZCARD', sessions) - cap
if over > 0 then          -- those whose keys expired first
  redis.call('ZREMRANGEBYSCORE', sessions, '-inf', t - ttl)
  over = redis.call('ZCARD', sessions) - cap
end
if over <= 0 then return 0 end
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
return over
"""

# KEYS: turn:<n>:<session>:<turn id>
# ARGV: prefix (unused), the record as it was read (running, its owner's alive key lapsed),
#       this hub's running record, record ttl
# Returns 1 when the record was still that one and is now this hub's, 0 when it changed (another
# hub took it over first, or its turn ended). Compare-and-set on the one key: WATCH/MULTI with
# the owner's alive key read inside would cross slots on a cluster.
TAKE_OVER = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'EX', tonumber(ARGV[4]))
return 1
"""

# a record claimed and then not run (hub/turn_runner.py), given up only if it is still this
# hub's claim: another replica may have taken it over meanwhile (this hub's alive key lapsed)
# KEYS: the record, turns:<client>; ARGV: prefix, this hub's running value, the member
UNCLAIM = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"""
