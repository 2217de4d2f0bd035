-- The baseline redis-rl is measured against: the classic token-bucket script that services
-- use before it (read the hash, refill from the server's TIME, check, write back). Kept as
-- teams write it: it writes on denials too and never sets an expiry,
-- so an idle bucket stays in memory forever. scripts/bench loads it with SCRIPT LOAD and
-- calls it with EVALSHA.
--
-- KEYS[1] the bucket's key; ARGV[1] rate (tokens per second); ARGV[2] capacity;
-- ARGV[3] tokens to take. Returns ARGV[3] if granted, 0 if denied.
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
-- The server's clock, not the caller's: callers' clocks disagree and can step back.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local data = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(data[1])
local ts = tonumber(data[2])
if tokens == nil then
    tokens = cap
    ts = now
end
local delta = now - ts
if delta > 0 then
    tokens = math.min(cap, tokens + delta * rate)
end
if tokens < want then
    redis.call('HMSET', key, 'tokens', tokens, 'ts', now)
    return 0
end
redis.call('HMSET', key, 'tokens', tokens - want, 'ts', now)
return want
