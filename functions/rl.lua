#!lua name=rl
-- redis-rl as a Redis Functions library: the module's protocol for servers where
-- `loadmodule` is not allowed. Load with `scripts/load-functions` (FUNCTION LOAD REPLACE).
--
--   FCALL rl_take    1 key rate cap [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]
--   FCALL rl_lease   1 key rate cap n ttl_ms [MIN m] [RETURN lease_id unused] [INIT tokens]
--                    [SHADOW] [VERSION v]
--   FCALL rl_return  1 key lease_id unused
--   FCALL rl_mtake   N key1..keyN n rate1 cap1 .. rateN capN [WITHSTATE] [INIT tokens]
--                    [SHADOW] [VERSION v]
--   FCALL rl_peek    1 key                        (no-writes: FCALL_RO, replicas)
--   FCALL rl_reserve 1 key rate cap n max_wait_ms [INIT tokens] [SHADOW] [VERSION v]
--   FCALL rl_refund  1 key n
--   FCALL rl_share   1 key rate cap holder want period_ms [RELEASE] [VERSION v]
--   FCALL rl_pin     1 key [SHARES] rate cap | BLOCK | EXEMPT [PX ms]
--   FCALL rl_unpin   1 key
--   FCALL rl_pinned  1 key                        (no-writes: FCALL_RO, replicas)
--
-- Same arguments, replies, error texts and arithmetic as the module (core/src/*.rs); see
-- docs/functions.md for where they differ (reply formatting only).
--
-- A plain bucket (f r c below and nothing else) is a string, `rl:<r>:<c>:` and full_at
-- packed (see "The string layout" below: one GET, one SET ... PXAT); every other bucket is
-- a hash (never the module's type: WRONGTYPE both ways):
--   f  full_at: the instant the bucket is full again, integer nanoseconds since the Unix
--      epoch, as decimal text (exact: it does not fit a Lua number, see below)
--   r  rate and c cap of the last write, as the caller wrote them (each parses to the
--      exact double the module stores)
--   v  the version of the limit in r c (`VERSION v`, core/src/version.rs), decimal text;
--      absent for version 0 (unversioned buckets, and hashes written before versions)
--   i  the last lease id handed out (present once the bucket had a lease)
--   l  leases, "id:tokens:expires_us," each, ids ascending (absent when none); it may
--      hold expired entries, which every reader skips (rl_lease appends without parsing
--      and drops only the expired ones at the front; see PRUNE_CHARS)
--   x  the latest expiry among the leases in `l`, microseconds (absent when none)
--   h  the hold, ns as decimal text like `f`, and
--   s  the span, ns as decimal text (both absent when the span is 0): after a write that
--      changed the limit, span = max(the live stored span, the old limit's fill time), and
--      every write sets h = the level's instant + span, so the key lives until it has been
--      idle for the span: a caller still on an old limit finds these tokens, not an absent
--      key (a full bucket). The stored span is live while h is after the level's instant;
--      once h has passed, the next write drops both (HDEL h s).
--   p  the pin (RL.PIN; see "Pins" below), absent when none: a hash without p is an
--      unpinned bucket, as every hash written before pins
-- Only an absent key is a full bucket: a hash without `f` (a user's record, the seed
-- script's `tokens`/`ts`), or whose fields are not what this library writes, is refused
-- with WRONGTYPE by every function and left as it is (`checked`).
-- The key expires (PEXPIREAT, or SET's PXAT) at ceil_ms(max(full_at, h, x)), set on every
-- write (also after PERSIST): when the bucket is full again, past its hold and no lease is live,
-- exactly as the module's key. RETURN and REFUND delete a key left full with no lease
-- only if its hold has passed too.
-- Debt: RL.RESERVE may debit tokens that are not there yet; full_at is then more than a
-- fill time away and the level's instant stays ahead of now (`behind`). Replies show it
-- as negative tokens (signed_tokens), and credits pay it back first.

-- Exactness. Lua numbers are doubles; instants in ns (~1.8e18) exceed 2^53. Every instant
-- and duration is kept as two exact numbers (s, n): seconds and nanoseconds (0 <= n < 1e9),
-- with add, saturating subtract and compare done on the pair. The module's float steps are
-- the same IEEE operations here, its directed roundings (core/src/round.rs) too (see
-- "Arithmetic rounded toward the safe side" below): nanos_for gives an integer-valued
-- double that is split exactly; tokens_for(d) = (d as f64) * rate / 1e9 converts the pair
-- with s * 1e9 + n, which is exact up to one correctly rounded addition, i.e. `as f64`
-- itself (s * 1e9 = s * 1953125 * 2^9 is exact for s < 4.6e9 s: durations up to 146 years).
-- Lease ids and lease expiries are microseconds (< 2^53): exact. The only difference with
-- the module is the clock: TIME has microseconds, the module reads nanoseconds.

local G = 1e9
-- Library code runs at FUNCTION LOAD with no globals (Redis 7.0 gives it only `redis`):
-- the standard functions are bound to these locals at the first call.
local floor, ceil, frexp, ldexp, fmt, upper, ssub, byte, char, gmatch, sfind
local call, pcall_r, error_reply
-- Whether PEXPIREAT gets its millisecond argument as text (Redis 7.0: see `store`).
local MS_TEXT = false
local function ms_arg(ms)
    if MS_TEXT then return fmt('%d', ms) end
    return ms
end
-- The string layout's functions (see "The string layout" below), in one table: Lua's 200
-- locals.
local Ly = {}
local function bind()
    Ly.pack, Ly.unpack = struct.pack, struct.unpack
    floor, ceil, frexp, ldexp = math.floor, math.ceil, math.frexp, math.ldexp
    fmt, upper, ssub, byte = string.format, string.upper, string.sub, string.byte
    char, gmatch, sfind = string.char, string.gmatch, string.find
    call, pcall_r, error_reply = redis.call, redis.pcall, redis.error_reply
    MS_TEXT = (tonumber(redis.REDIS_VERSION_NUM) or 0) < 0x070200
end

local MIN_VALUE, MAX_VALUE = 1e-9, 1e15
local MAX_FILL_SECS = 100.0 * 365.25 * 86400.0
local MAX_LEASES = 1024
local MAX_TTL_MS = 86400000
local MAX_BUCKETS = 64
local HUGE_NS = 2 ^ 62 -- beyond any duration a valid limit makes: "saturated"
local MAX_VERSION = 9007199254740991 -- 2^53 - 1: every version is an exact Lua number

-- Errors: raised as a table, turned into the reply at the function's boundary.
local function fail(msg) error({ rl = msg }, 0) end
-- Each command's usage, for arity errors: the same text as the module's, which makes it
-- from its command table (protocol/commands.json; the tests check they agree).
local USAGE = {
    ['RL.TAKE'] = 'RL.TAKE key rate cap [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]',
    ['RL.LEASE'] = 'RL.LEASE key rate cap n ttl_ms [MIN m] [RETURN lease_id unused] [INIT tokens] [SHADOW] [VERSION v]',
    ['RL.RETURN'] = 'RL.RETURN key lease_id unused',
    ['RL.MTAKE'] = 'RL.MTAKE n key rate cap [key rate cap ...] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v]',
    ['RL.BUDGET'] = 'RL.BUDGET ttl_ms key rate cap n [key rate cap n ...] [WITHSTATE] [SHADOW] [VERSION v]',
    ['RL.SETTLE'] = 'RL.SETTLE reservation_id key actual [key actual ...]',
    ['RL.PEEK'] = 'RL.PEEK key',
    ['RL.RESERVE'] = 'RL.RESERVE key rate cap n max_wait_ms [INIT tokens] [SHADOW] [VERSION v]',
    ['RL.REFUND'] = 'RL.REFUND key n',
    ['RL.SHARE'] = 'RL.SHARE key rate cap holder want period_ms [RELEASE] [VERSION v]',
    ['RL.PIN'] = 'RL.PIN key rate cap | BLOCK | EXEMPT | PERMITS n|BLOCK|EXEMPT | SHARES rate cap|BLOCK|EXEMPT [PX ms]',
    ['RL.UNPIN'] = 'RL.UNPIN key',
    ['RL.PINNED'] = 'RL.PINNED key',
}
local function arity(name)
    fail('wrong number of arguments for \'' .. name .. '\' command; usage: ' .. USAGE[name])
end

-- ---------------------------------------------------------------------------------------
-- Exact nanosecond pairs (s, n).

local function split(d) -- an integer-valued double (a `Nanos` the module computes in f64)
    if not (d > 0) then return 0, 0 end -- negative, -0.0 and NaN are 0 as u64
    if d >= HUGE_NS then return HUGE_NS, 0 end
    local s = floor(d / G)
    local n = d - s * G
    if n < 0 then s = s - 1; n = n + G elseif n >= G then s = s + 1; n = n - G end
    return s, n
end

local function add(as, an, bs, bn)
    local s, n = as + bs, an + bn
    if n >= G then return s + 1, n - G end
    return s, n
end

local function lt(as, an, bs, bn) return as < bs or (as == bs and an < bn) end

local function sat_sub(as, an, bs, bn) -- saturating a - b
    if lt(as, an, bs, bn) then return 0, 0 end
    local s, n = as - bs, an - bn
    if n < 0 then return s - 1, n + G end
    return s, n
end

local function to_f64(s, n) return s * G + n end

local function ceil_ms(s, n) return s * 1000 + ceil(n / 1e6) end

local function parse_instant(t) -- decimal ns text -> pair
    local len = #t
    if len <= 9 then return 0, tonumber(t) end
    return tonumber(ssub(t, 1, len - 9)), tonumber(ssub(t, len - 8))
end

-- The seconds' text of the last instant written: most writes fall in the second before.
local it_s, it_text = -1, ''
local function instant_text(s, n)
    if s == 0 then return fmt('%d', n) end
    if s ~= it_s then it_s, it_text = s, fmt('%d', s) end
    return it_text .. fmt('%09d', n)
end

-- ---------------------------------------------------------------------------------------
-- Arithmetic rounded toward the safe side (core/src/round.rs), bit for bit: the nearest
-- double, then the exact error term says on which side of the true value it fell, and one
-- step outward when on the wrong side. The module gets the error of a product or quotient
-- from `mul_add`; Lua has no fused multiply-add, so it is Dekker's exact product (Veltkamp
-- split), exact for every operand here (no overflow: all below 1e33; no underflow: none
-- below 1e-40).

local TINY = 4.9406564584124654e-324

local function next_up(x)
    if x == 0 then return TINY end
    local m, e = frexp(x) -- x = m * 2^e, 0.5 <= |m| < 1
    local u = ldexp(1, e - 53)
    if m == -0.5 then u = u / 2 end -- -2^k: the step toward 0 is half as long
    if u < TINY then u = TINY end
    return x + u
end

local function next_down(x) return -next_up(-x) end

local SPLIT = 134217729 -- 2^27 + 1
-- The exact a * b - p, for p = a * b rounded (Dekker's TwoProduct).
local function prod_err(a, b, p)
    local t = SPLIT * a
    local ah = t - (t - a)
    local al = a - ah
    t = SPLIT * b
    local bh = t - (t - b)
    local bl = b - bh
    return al * bl - (((p - ah * bh) - al * bh) - ah * bl)
end

-- The sign of a - q * b for q = a / b rounded (the remainder is exact: a - p by Sterbenz).
local function quot_err(a, b, q)
    local p = q * b
    return (a - p) - prod_err(q, b, p)
end

local function mul_up(a, b)
    local p = a * b
    if prod_err(a, b, p) > 0 then return next_up(p) end
    return p
end

local function mul_down(a, b)
    local p = a * b
    if prod_err(a, b, p) < 0 then return next_down(p) end
    return p
end

local function div_up(a, b)
    local q = a / b
    if quot_err(a, b, q) > 0 then return next_up(q) end
    return q
end

local function div_down(a, b)
    local q = a / b
    if quot_err(a, b, q) < 0 then return next_down(q) end
    return q
end

local function two_sum(a, b)
    local s = a + b
    local bb = s - a
    return s, (a - (s - bb)) + (b - bb)
end

local function sub_up(a, b)
    local s, err = two_sum(a, -b)
    if err > 0 then return next_up(s) end
    return s
end

local function sub_down(a, b)
    local s, err = two_sum(a, -b)
    if err < 0 then return next_down(s) end
    return s
end

-- A pair as a double no smaller than it (s * 1e9 is exact: see the header).
local function nanos_up(s, n)
    local x, err = two_sum(s * G, n)
    if err > 0 then return next_up(x) end
    return x
end

-- G split for Dekker's product (constants: computed at load).
local GH = SPLIT * G - (SPLIT * G - G)
local GL = G - GH

-- Whether t * 1e9 (= p) and p / rate (= q) were both exact (`exact_ratio`): the common
-- case, where q alone is the answer. Inlined products: this runs on every take.
local function exact_ratio(t, rate, p, q)
    local x = SPLIT * t
    local th = x - (x - t)
    local tl = t - th
    if tl * GL - (((p - th * GH) - tl * GH) - th * GL) ~= 0 then return false end
    local qb = q * rate
    if qb ~= p then return false end
    x = SPLIT * q
    local qh = x - (x - q)
    local ql = q - qh
    x = SPLIT * rate
    local rh = x - (x - rate)
    local rl = rate - rh
    return ql * rl - (((qb - qh * rh) - ql * rh) - qh * rl) == 0
end

-- Time to refill t at rate, rounded up / down to whole ns (as an integer-valued double;
-- `split` makes it a pair). Two orders of the same product and quotient, the tighter kept,
-- unless the first is exact (the common case: then it alone).
-- Rust's f64::round: half away from zero (x - floor(x) is exact).
local function round_half_away(x)
    if x < 0 then
        local r = floor(-x)
        if -x - r >= 0.5 then r = r + 1 end
        return -r
    end
    local r = floor(x)
    if x - r >= 0.5 then r = r + 1 end
    return r
end

-- How many tokens a conversion may round in the caller's favour to land on a whole ns
-- (SNAP_TOKENS_NS in round.rs): 1e-12 tokens, in token-ns.
local SNAP_TOKENS_NS = 1e-12 * G

-- Time to refill t at rate, rounded up / down to whole ns (as an integer-valued double;
-- `split` makes it a pair). Exact ratio (the common case): it alone. Else two orders of
-- the same product and quotient, the tighter kept, and the nearest whole ns instead when
-- the bound is within 1e-12 tokens of it (refill_nanos_ceil / _floor in round.rs).
local function refill_ceil(t, rate)
    local p = t * G
    local q = p / rate
    if exact_ratio(t, rate, p, q) then return ceil(q) end
    local up = div_up(mul_up(t, G), rate)
    local b = mul_up(div_up(t, rate), G)
    if b < up then up = b end
    local near = round_half_away(q)
    if (up - near) * rate <= SNAP_TOKENS_NS then
        if near < 0 then return 0 end
        return near
    end
    return ceil(up)
end

local function refill_floor(t, rate)
    local p = t * G
    local q = p / rate
    local a
    if exact_ratio(t, rate, p, q) then
        a = floor(q)
    else
        local down = div_down(mul_down(t, G), rate)
        local b = mul_down(div_down(t, rate), G)
        if b > down then down = b end
        local near = round_half_away(q)
        if (near - down) * rate <= SNAP_TOKENS_NS then
            a = near
        else
            a = floor(down)
        end
    end
    if a < 0 then return 0 end
    return a
end

-- Tokens refilled in the pair's time at rate, rounded up.
local function tokens_in_up(s, n, rate) return div_up(mul_up(nanos_up(s, n), rate), G) end

-- ---------------------------------------------------------------------------------------
-- Argument parsing (src/args.rs).

-- Rust's f64::from_str grammar; inf/nan (any case, signed) give a value every range check
-- refuses, as the module's do.
local function parse_number(t)
    if not t then return nil end
    local body = t
    local c = byte(t, 1)
    if c == 43 or c == 45 then body = ssub(t, 2) end
    if body:find('^%d+%.?%d*$') or body:find('^%.%d+$')
        or body:find('^%d+%.?%d*[eE][+-]?%d+$') or body:find('^%.%d+[eE][+-]?%d+$') then
        return tonumber(t)
    end
    local l = body:lower()
    if l == 'inf' or l == 'infinity' or l == 'nan' then return 1 / 0 end
    return nil
end

local I64_MAX = '9223372036854775807'

-- Texts already parsed as valid integers (n, ttl_ms, ...): most calls repeat a few.
-- Bounded: emptied when full. Values only, so a hit is the parse's own answer.
local INTS, INTS_N = {}, 0

-- Digits only, at most i64::MAX. Returns the value (a double: exact below 2^53).
local function parse_integer(t)
    local v = INTS[t]
    if v then return v end
    if not t or #t == 0 or #t > 19 or t:find('%D') then return nil end
    if #t == 19 and t > I64_MAX then return nil end
    v = tonumber(t)
    if INTS_N >= 1024 then INTS, INTS_N = {}, 0 end
    INTS[t] = v
    INTS_N = INTS_N + 1
    return v
end

local function need(a, i, name)
    local v = a[i]
    if v == nil then arity(name) end
    return v
end

local function number(a, i, name, what)
    local x = parse_number(need(a, i, name))
    if x == nil then fail(what) end
    return x
end

local function integer(a, i, name, what)
    local x = parse_integer(need(a, i, name))
    if x == nil then fail(what) end
    return x
end

local function positive(a, i, name, what)
    local x = integer(a, i, name, what)
    if x == 0 then fail(what) end
    return x
end

-- The v of `VERSION v` at a[i]: an integer 0..2^53-1; nil for 0 (no version: what a
-- call without VERSION passes).
local BAD_VERSION = 'VERSION must be an integer from 0 to 9007199254740991'
local function version_at(a, i, name)
    local v = integer(a, i, name, BAD_VERSION)
    if v > MAX_VERSION then fail(BAD_VERSION) end
    if v == 0 then return nil end
    return v
end

-- Integer texts compared exactly (u64 comparisons of the module, beyond 2^53 too).
local function int_gt(a, b)
    a = a:gsub('^0+', ''); b = b:gsub('^0+', '')
    if #a ~= #b then return #a > #b end
    return a > b
end

local function is(t, name) return #t == #name and upper(t) == name end

-- String::from_utf8_lossy of the first 64 bytes, NUL shown as '?'.
local function lossy(t)
    t = ssub(t, 1, 64)
    local out, i, len = {}, 1, #t
    while i <= len do
        local c = byte(t, i)
        local need_, lo, hi = 0, 0x80, 0xBF
        if c < 0x80 then need_ = 0
        elseif c >= 0xC2 and c <= 0xDF then need_ = 1
        elseif c == 0xE0 then need_, lo = 2, 0xA0
        elseif c >= 0xE1 and c <= 0xEC then need_ = 2
        elseif c == 0xED then need_, hi = 2, 0x9F
        elseif c >= 0xEE and c <= 0xEF then need_ = 2
        elseif c == 0xF0 then need_, lo = 3, 0x90
        elseif c >= 0xF1 and c <= 0xF3 then need_ = 3
        elseif c == 0xF4 then need_, hi = 3, 0x8F
        else need_ = -1 end
        if need_ == 0 then
            out[#out + 1] = (c == 0) and '?' or char(c); i = i + 1
        elseif need_ < 0 then
            out[#out + 1] = '\239\191\189'; i = i + 1
        else
            local j, ok = i + 1, true
            for k = 1, need_ do
                local d = byte(t, j)
                local l2, h2 = 0x80, 0xBF
                if k == 1 then l2, h2 = lo, hi end
                if not d or d < l2 or d > h2 then ok = false; break end
                j = j + 1
            end
            if ok then out[#out + 1] = ssub(t, i, j - 1) else out[#out + 1] = '\239\191\189' end
            i = j
        end
    end
    return table.concat(out)
end

local function unknown(t) fail('unknown option \'' .. lossy(t) .. '\'') end
-- An option given a second time (every command refuses it, named in capitals).
local function twice(t) fail('option \'' .. upper(lossy(t)) .. '\' given twice') end
local function once(given, t) if given then twice(t) end end
-- Whether an argument reads as a number rather than an option name: in `n`'s place,
-- `RL.TAKE k 10 10 FOO` is an unknown option, not a bad count.
local function looks_numeric(t)
    local b = t:byte(1)
    return b ~= nil and ((b >= 48 and b <= 57) or b == 45 or b == 43 or b == 46)
end

-- ---------------------------------------------------------------------------------------
-- Limits (core/src/limit.rs).

local function in_range(x) return x >= MIN_VALUE and x <= MAX_VALUE end

local function make_limit(rate, cap, rt, ct)
    return { r = rate, c = cap, rt = rt, ct = ct }
end

-- fill_nanos, computed once a call needs it (most do not: see `refill`).
local function fill(L)
    if not L.fs then L.fs, L.fn = split(refill_ceil(L.c, L.r)) end
    return L.fs, L.fn
end

-- clearly_below / clearly_above (limit.rs): `ns` (a double) certainly below / above the
-- time to refill t, decided with a margin far wider than the nearest division's error.
local function clearly_below(L, ns, t) return ns < t * G / L.r * (1 - 1e-9) end
local function clearly_above(L, ns, t) return ns > t * G / L.r * (1 + 1e-9) + 1 end

-- Limits already validated, by their texts (LIMITS[rate text][cap text]): a call with a
-- known limit skips parsing and validation, and finds its fill time and debits computed
-- (`fill`, `debit`). Library locals live as long as the library; bounded, emptied when full.
local LIMITS, LIMITS_N = {}, 0

local function known_limit(rt, ct)
    local byr = LIMITS[rt]
    if byr then return byr[ct] end
    return nil
end

local function remember(L)
    if LIMITS_N >= 1024 then LIMITS, LIMITS_N = {}, 0 end
    local byr = LIMITS[L.rt]
    if not byr then
        byr = {}
        LIMITS[L.rt] = byr
    end
    byr[L.ct] = L
    LIMITS_N = LIMITS_N + 1
    return L
end

local function limit_at(a, i, name)
    local rt, ct = a[i], a[i + 1]
    local byr = rt and LIMITS[rt] -- the common case inline: a limit seen before
    if byr and ct then
        local L = byr[ct]
        if L then return L end
    end
    local rate = number(a, i, name, 'rate is not a number')
    local cap = number(a, i + 1, name, 'cap is not a number')
    if not in_range(rate) then fail('rate must be a finite number between 1e-9 and 1e15') end
    if not in_range(cap) then fail('cap must be a finite number between 1e-9 and 1e15') end
    if cap / rate > MAX_FILL_SECS then fail('cap / rate must be at most 100 years') end
    return remember(make_limit(rate, cap, rt, ct))
end

-- The limit of a stored bucket, from its texts (written by a call that validated them).
-- A hash written by anything else (HSET r 0, r 0x10, no r at all) is refused as not a
-- bucket, before anything is written: its limit must neither decide a call (rate 0 made
-- a write whose expiry Redis then refused) nor reach LIMITS, which `limit_at` and the
-- plain-call paths trust without checking.
local function not_a_bucket(why)
    error({ reply = error_reply('WRONGTYPE the hash at this key is not a bucket of this library ('
        .. why .. ')') }, 0)
end
local function stored_texts(rt, ct)
    local L = known_limit(rt, ct)
    if L then return L end
    local rate, cap = parse_number(rt), parse_number(ct)
    if not (rate and cap and in_range(rate) and in_range(cap) and cap / rate <= MAX_FILL_SECS) then
        not_a_bucket('its fields r, c are not a valid limit')
    end
    return remember(make_limit(rate, cap, rt, ct))
end

-- A stored version's text (nil: none, 0) as a number; anything but 0..2^53-1 in digits is
-- no version this library wrote.
local function stored_version(vt)
    if not vt then return 0 end
    local x = parse_integer(vt)
    if not x or x > MAX_VERSION then not_a_bucket('its field v is not a version') end
    return x
end

local function nanos_for(L, t) return split(refill_ceil(t, L.r)) end

-- nanos_for(L, n) of a whole n (a debit), remembered per limit (at most 64 of them).
local function debit(L, n)
    local qs = L.qs
    if qs then
        local s = qs[n]
        if s then return s, L.qn[n] end
    else
        qs = {}
        L.qs, L.qn, L.qc = qs, {}, 0
    end
    local s, ns = nanos_for(L, n)
    if L.qc < 64 then
        if not L.qb then L.qb = {} end
        -- has()'s `clearly_below(L, d, cap - n)`, the same expression: a deficit below it
        -- has n tokens (-1 when n > cap: never).
        local spare = L.c - n
        L.qb[n] = spare >= 0 and spare * G / L.r * (1 - 1e-9) or -1
        qs[n], L.qn[n], L.qc = s, ns, L.qc + 1
    end
    return s, ns
end
local function nanos_for_floor(L, t) return split(refill_floor(t, L.r)) end
local function tokens_for(L, s, n) return to_f64(s, n) * L.r / 1e9 end

local function fits(n, L, what)
    if n > L.c then fail(what) end
end

local function init_tokens(a, i, L, name)
    local x = number(a, i, name, 'INIT must be a number')
    if not (x >= 0 and x <= L.c) then fail('INIT must be between 0 and cap') end
    return x
end

-- ---------------------------------------------------------------------------------------
-- Levels (core/src/bucket.rs): a bucket refilled to `now` under a limit.
-- Fields: L; as/an = at; bs/bn = behind; ds/dn = deficit; ss/sn = span (0, 0: none).

-- A level is a table; `into` (optional) is one to fill instead of a new one: a command
-- on one bucket reuses a single table (SCRATCH) for every call, which measured cheaper
-- than a new table per call (the grant path; docs/functions.md, "Measured cost").
local function new_level(into, L, as, an, bs, bn, ds, dn)
    if into then
        into.L, into.as, into.an, into.bs, into.bn = L, as, an, bs, bn
        into.ds, into.dn, into.ss, into.sn = ds, dn, 0, 0
        return into
    end
    return { L = L, as = as, an = an, bs = bs, bn = bn, ds = ds, dn = dn, ss = 0, sn = 0 }
end

local SCRATCH = {}

local function full_level(L, ns, nn, into)
    if into then
        into.L, into.as, into.an, into.bs, into.bn = L, ns, nn, 0, 0
        into.ds, into.dn, into.ss, into.sn = 0, 0, 0, 0
        return into
    end
    return new_level(nil, L, ns, nn, 0, 0, 0, 0)
end

local function min_pair(as, an, bs, bn)
    if lt(bs, bn, as, an) then return bs, bn end
    return as, an
end

-- carry_over: a deficit under B carried to L, rounded so no token appears.
local function carry_over(ds, dn, B, L)
    if B.r == L.r then
        -- Only the cap moved: the deficit moves by the time-value of the difference.
        if L.c >= B.c then
            local gs, gn = nanos_for(L, sub_up(L.c, B.c))
            local s, n = add(ds, dn, gs, gn)
            return min_pair(s, n, fill(L))
        end
        local ks, kn = nanos_for_floor(L, sub_down(B.c, L.c))
        local s, n = sat_sub(ds, dn, ks, kn)
        return min_pair(s, n, fill(L))
    end
    local t = sub_down(B.c, tokens_in_up(ds, dn, B.r))
    if t < 0 then t = 0 elseif t > L.c then t = L.c end
    local missing = sub_up(L.c, t)
    if missing > L.c then missing = L.c end
    local s, n = nanos_for(L, missing)
    return min_pair(s, n, fill(L))
end

local function refill(fs, fn, L, ns, nn, into)
    if fs < ns or (fs == ns and fn <= nn) then
        -- Full by now (the common case of a grant): at now, nothing behind, no deficit.
        return new_level(into, L, ns, nn, 0, 0, 0, 0)
    end
    -- Never before the bucket was empty (a clock that stepped back, or debt); the common
    -- case decided without the exactly rounded fill time.
    local ds, dn = sat_sub(fs, fn, ns, nn)
    if clearly_below(L, to_f64(ds, dn), L.c) then
        return new_level(into, L, ns, nn, 0, 0, ds, dn)
    end
    local as, an = ns, nn
    local es, en = sat_sub(fs, fn, fill(L))
    if lt(ns, nn, es, en) then as, an = es, en end
    local bs, bn = sat_sub(as, an, ns, nn)
    ds, dn = sat_sub(fs, fn, as, an)
    return new_level(into, L, as, an, bs, bn, ds, dn)
end

-- Tokens, clamped to [0, cap] (what a lease may take).
local function tokens(lv)
    local t = lv.L.c - tokens_for(lv.L, lv.ds, lv.dn)
    if t < 0 then return 0.0 end
    return t
end

-- Tokens now, negative while the bucket is in debt (RL.RESERVE, a clock step back): the
-- `remaining` / `tokens` of every reply.
-- Never negative out of debt: the time owed is whole nanoseconds, rounded up, so a bucket
-- emptied exactly converts back to a hair below 0.
local function signed_tokens(lv)
    local L = lv.L
    local ws, wn = add(lv.bs, lv.bn, lv.ds, lv.dn)
    local t = L.c - tokens_for(L, ws, wn)
    if t < 0 then
        local fs, fn = fill(L)
        if not lt(fs, fn, ws, wn) then return 0 end
    end
    return t
end

-- A stored bucket's limit (texts rt ct, version text vt: false when 0) and the limit that
-- decides a call with limit L at version v (nil: 0), as rl_core::version::resolve:
-- returns B (the stored limit; L itself when equal as doubles), the deciding limit, and
-- the version the write must store (nil: the stored one stays).
-- - v > stored: L replaces B (carried over by level_new), the new version written even
--   if the call is denied (the caller sees it: `wv` of a stored bucket);
-- - v < stored (a stale caller): B decides, as if the call had passed it;
-- - v = stored: L decides, as without versions.
local function stored_limit(rt, ct, L, vt, v)
    local sv = stored_version(vt)
    v = v or 0
    if v < sv then
        if rt == L.rt and ct == L.ct then return L, L, nil end
        local B = stored_texts(rt, ct)
        return B, B, nil
    end
    local B = L
    if rt ~= L.rt or ct ~= L.ct then
        B = stored_texts(rt, ct)
        if B.r == L.r and B.c == L.c then B = L end
    end
    if v > sv then return B, L, v end
    return B, L, nil
end

-- Level::new for a stored bucket (full_at fs/fn, limit B, hold hs/hn, span ss/sn) and a
-- call's limit L. The stored span is live while its hold is after the level's instant.
-- With the same limit the level keeps it; with another, the span is at least the time the
-- old limit takes to fill (the key then lives that long after every write).
local function level_new(fs, fn, B, L, ns, nn, hs, hn, ss, sn, into)
    local lv = refill(fs, fn, B, ns, nn, into)
    if not lt(lv.as, lv.an, hs, hn) then ss, sn = 0, 0 end
    if B ~= L then
        lv.ds, lv.dn = carry_over(lv.ds, lv.dn, B, L)
        lv.L = L
        local os, on = fill(B)
        if lt(ss, sn, os, on) then ss, sn = os, on end
    end
    lv.ss, lv.sn = ss, sn
    return lv
end

local function starting_with(L, t, ns, nn, into)
    if t < 0 then t = 0 elseif t > L.c then t = L.c end
    local lv = full_level(L, ns, nn, into)
    lv.ds, lv.dn = nanos_for(L, sub_up(L.c, t))
    return lv
end

-- wait_for: pair, or nil when n > cap.
local function wait_for(lv, n)
    local spare = sub_down(lv.L.c, n)
    if not (spare >= 0) then return nil end
    local os, on = nanos_for_floor(lv.L, spare)
    local ws, wn = sat_sub(lv.ds, lv.dn, os, on)
    if ws == 0 and wn == 0 then return 0, 0 end
    return add(lv.bs, lv.bn, ws, wn)
end

-- Whether n tokens are there now (wait_for == 0), most often without the exact arithmetic.
local function has(lv, n)
    local L = lv.L
    local spare = L.c - n
    if spare < 0 then return false end
    local d = to_f64(lv.ds, lv.dn)
    if clearly_below(L, d, spare) then return true end
    if clearly_above(L, d, spare) then return false end
    local ws, wn = wait_for(lv, n)
    return ws == 0 and wn == 0
end

local function try_take(lv, n)
    local L = lv.L
    local qb = L.qb
    if qb then
        -- The common case: a debit of n computed before, and n clearly there (has()'s first
        -- test, its threshold remembered by `debit`).
        local b = qb[n]
        if b and lv.ds * G + lv.dn < b then
            local s, ns = lv.ds + L.qs[n], lv.dn + L.qn[n]
            if ns >= G then s, ns = s + 1, ns - G end
            lv.ds, lv.dn = s, ns
            return true
        end
    end
    if not has(lv, n) then return false end
    local ts, tn = debit(lv.L, n)
    lv.ds, lv.dn = add(lv.ds, lv.dn, ts, tn)
    return true
end

local function take_up_to(lv, n, min)
    local got = math.min(n, floor(tokens(lv)))
    local lo = math.max(min, 1)
    while got >= lo do
        if try_take(lv, got) then return got end
        got = got - 1
    end
    return 0
end

-- Level::credit: `t` tokens back, clamped to cap. A bucket behind now (in debt after
-- RL.RESERVE, or after the clock stepped back) takes nothing back: its coming tokens are
-- promised to callers waiting for a set instant.
local function credit(lv, t)
    if lv.bs ~= 0 or lv.bn ~= 0 then return end
    local cs, cn = nanos_for_floor(lv.L, t)
    lv.ds, lv.dn = sat_sub(lv.ds, lv.dn, cs, cn)
end

-- RL.REFUND: up to n tokens back, as many as the bucket lacks (nothing in debt).
local function refund(lv, n)
    if lv.bs ~= 0 or lv.bn ~= 0 then return 0 end
    local missing = tokens_for(lv.L, lv.ds, lv.dn)
    local credited = n
    if missing < credited then credited = missing end
    credit(lv, credited)
    return credited
end

local function reset_after(lv) return add(lv.bs, lv.bn, lv.ds, lv.dn) end
local function full_at(lv) return add(lv.as, lv.an, lv.ds, lv.dn) end

-- The hold a write stores: `span` after the level's instant (0, 0: no span, no hold).
local function hold_at(lv)
    if lv.ss == 0 and lv.sn == 0 then return 0, 0 end
    return add(lv.as, lv.an, lv.ss, lv.sn)
end

local function wait_ms(s, n)
    if s == nil then return 0 end -- n > cap: map_or(0, ...)
    return ceil_ms(s, n)
end

-- ---------------------------------------------------------------------------------------
-- Keys.

-- The seconds of the last TIME, text and number: they change once a second, and a string
-- compare is cheaper than parsing them again.
local last_st, last_s = nil, 0

local function now()
    local t = call('TIME')
    local st, s = t[1], last_s
    if st ~= last_st then
        s = tonumber(st)
        last_st, last_s = st, s
    end
    local us = tonumber(t[2])
    return s, us * 1000, s * 1e6 + us
end

-- HMGET of a bucket's fields (f r c h s x), and with its lease table (i l), WRONGTYPE
-- answered as the module does (redis.call would append script info). The version `v` is
-- read (at V, false when absent) by a call with VERSION, and by rl_peek; a call without
-- one reads it only if its limit's texts differ from the stored ones (`level_of`): with the
-- same texts, an older stored version decides under that same limit and keeps its version,
-- so the plain call's read is the one it was before versions.
-- Every read is HMGET f r c h s x p [i l] [v]: these positions (p, the pin, in the array
-- part of the reply on every read: a field moved beyond it measured dearer).
local F, R, C, H, S, X, P, I, LS, V = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
-- The pin functions (see "Pins" below), in one table: a chunk may have at most 200 locals.
local Pn = {}


-- The string layout: a plain bucket (f r c only: no version, span, lease, lease id or pin)
-- is one string `rl:<r>:<c>:<f>` with the key's expiry, written by one SET ... PXAT (value
-- and expiry in one call) and read by one GET. Its `<f>` is full_at packed, 12 bytes: the
-- seconds as a little-endian double and the nanoseconds as a little-endian u32
-- (struct.pack('<dI4'): exact, no number parsed or formatted as text on either side). Every other bucket is a hash as above. A
-- string bucket that needs another field is deleted and written as a hash (`write`); a
-- hash known to hold only f r c (every field read: h.all) is rewritten as a string on its
-- next plain write, which replaces it (`store`): hashes written by earlier versions of the
-- library are read as they are and move to the string on their next write.
Ly.h = { str = true }
Ly.WRONG = 'WRONGTYPE Operation against a key holding the wrong kind of value'
-- The string's prefix for limit L: `rl:<r>:<c>:` (L.tn: its length + 1).
function Ly.tag_of(L)
    local t = 'rl:' .. L.rt .. ':' .. L.ct .. ':'
    L.tag, L.tn = t, #t + 1
    return t
end
-- The full_at packed at g[at]: exactly 12 bytes, whole seconds below 1e10 (what digits()
-- allows a text f) and nanoseconds below 1e9; nil for anything else.
function Ly.pair(g, at)
    if #g ~= at + 11 then return nil end
    local fs, fn = Ly.unpack('<dI4', g, at)
    if not (fs >= 0 and fs < 1e10 and fs == floor(fs) and fn < G) then return nil end
    return fs, fn
end
-- The fields of a string bucket (h.str; f as text, as a hash has it), nil for a string this
-- library did not write.
function Ly.string_bucket(g)
    local rt, ct, at = g:match('^rl:([^:]+):([^:]+):()')
    if not rt then return nil end
    local fs, fn = Ly.pair(g, at)
    if not fs then return nil end
    return { instant_text(fs, fn), rt, ct, str = true }
end
-- Every field of a hash (f r c h s x p i l v at F..V): h.all.
function Ly.hmget_all(key)
    local h = pcall_r('HMGET', key, 'f', 'r', 'c', 'h', 's', 'x', 'p', 'i', 'l', 'v')
    if not h.err then h.all = true end
    return h
end
-- The bucket at key read string first (the common case: one GET); a hash, all its fields.
-- h.none: no key. A string this library did not write, or another type: WRONGTYPE (h.err).
function Ly.get_bucket(key)
    local g = pcall_r('GET', key)
    if not g then return { none = true } end
    if type(g) == 'string' then return Ly.string_bucket(g) or { err = Ly.WRONG } end
    return Ly.hmget_all(key)
end
-- Whether the value at key is a string bucket of this library (for the error texts of
-- calls that take hashes only: shares).
function Ly.string_at(key)
    local g = pcall_r('GET', key)
    return type(g) == 'string' and Ly.string_bucket(g) ~= nil
end

-- Whether t is 1 to 19 digits (an instant, duration, id or expiry this library wrote:
-- below 1e19, so every value fits a u64 and its expiry fits PEXPIREAT).
local function digits(t) return t ~= '' and #t <= 19 and not sfind(t, '%D') end

-- A key whose hash has no `f`: absent (a full bucket), or a hash this library did not
-- write, which no call may read as absent (it would write f r c into it and set an expiry:
-- a user's record gone with the bucket). The seed script's bucket (scripts/token_bucket.lua,
-- exactly `tokens` and `ts`) is named: the module can adopt it, the library does not.
local function absent(key)
    if call('EXISTS', key) == 0 then return end
    local t = call('HMGET', key, 'tokens', 'ts', 'R', 'C')
    if t[3] and t[4] then
        not_a_bucket('it is a rate share of this library (rl_share)')
    end
    if t[1] and t[2] and call('HLEN', key) == 2 then
        not_a_bucket('it is the seed script\'s bucket (fields tokens, ts), which the library '
            .. 'does not adopt: DEL the key to start from a full bucket, or adopt it with '
            .. 'the module (rl.adopt-script-keys yes)')
    end
    not_a_bucket('it has no field f')
end

-- The fields read (h) of the hash at `key`, checked before any of them is used: a field
-- the library writes only as decimal digits holding anything else is a hash this library
-- did not write (refused, nothing written), not a value to guess from. `r`, `c` are
-- checked where a limit is read from them (`stored_texts`), `v` where it is compared
-- (`stored_version`). Returns h.
local function checked(h, key)
    local ft = h[F]
    if not ft then
        -- A key that holds only a pin (RL.PIN on a key without a bucket) has p alone.
        if not h[P] then
            if not h.none then absent(key) end
            h.none = true
        elseif not Pn.parse_pin(h[P]).absent then
            not_a_bucket('it has a pin over no field f')
        end
        return h
    end
    if not digits(ft) then not_a_bucket('its field f is not an instant') end
    local t = h[H]
    if t and not digits(t) then not_a_bucket('its field h is not an instant') end
    t = h[S]
    if t and not digits(t) then not_a_bucket('its field s is not a duration') end
    t = h[X]
    if t and not digits(t) then not_a_bucket('its field x is not an instant') end
    t = h[I]
    if t and not digits(t) then not_a_bucket('its field i is not a lease id') end
    return h
end

-- `with_v`: read v too.
-- The bucket read string first (calls whose buckets are mostly plain: MTAKE, RESERVE,
-- PEEK, REFUND); `with_v` is moot: a hash is read whole.
local function read(key)
    local h = Ly.get_bucket(key)
    if h.err then error({ reply = h }, 0) end
    return checked(h, key)
end

-- The bucket with its lease table read hash first (calls whose buckets mostly hold
-- leases), a string bucket on WRONGTYPE.
local function read_leases(key, with_v)
    local h
    if with_v then
        h = pcall_r('HMGET', key, 'f', 'r', 'c', 'h', 's', 'x', 'p', 'i', 'l', 'v')
        if not h.err then h.all = true end
    else
        h = pcall_r('HMGET', key, 'f', 'r', 'c', 'h', 's', 'x', 'p', 'i', 'l')
    end
    if h.err then
        local g = pcall_r('GET', key)
        if type(g) ~= 'string' then error({ reply = h }, 0) end
        h = Ly.string_bucket(g)
        if not h then error({ reply = { err = Ly.WRONG } }, 0) end
    end
    return checked(h, key)
end

-- level_of's general case: a stored bucket (full_at text ft) for a call whose limit's
-- texts differ from the stored ones, or with VERSION. The stored limit and version decide
-- which limit applies (`stored_limit`); returns the level and the version to write.
local function level_versioned(h, ft, L, ns, nn, into, v, key)
    local vt = h[V]
    if vt == nil then
        if h.str then vt = false else vt = call('HGET', key, 'v') end
        h[V] = vt
    end
    local B, D, wv = stored_limit(h[R], h[C], L, vt, v)
    local fs, fn = parse_instant(ft)
    local hs, hn, ss, sn = 0, 0, 0, 0
    if h[H] then
        hs, hn = parse_instant(h[H])
        ss, sn = parse_instant(h[S] or '0')
    end
    return level_new(fs, fn, B, D, ns, nn, hs, hn, ss, sn, into), wv
end

-- The level of the bucket in `h` for a call with limit L at version v (nil: none, 0),
-- and the version a write must store (nil: none, or the stored one unchanged). The level's
-- limit is the one that decides the call: L, or the stored one for a stale version.
-- `into`: a table to fill (SCRATCH) instead of a new one. `key`: where to read the stored
-- version if `h` has not (see hmget_bucket).
local function level_of(h, L, init, ns, nn, into, v, key)
    local ft = h[F]
    if ft then
        if h[R] ~= L.rt or h[C] ~= L.ct or v then
            return level_versioned(h, ft, L, ns, nn, into, v, key)
        end
        -- The stored limit's texts are the call's and no version given: L decides (a newer
        -- stored version decides under that same limit and stays: see hmget_bucket).
        local hs, hn, ss, sn = 0, 0, 0, 0
        local fs, fn
        if not h[H] and #ft > 9 then
            -- The common cases: the same limit, no span. A full_at clearly before now (the
            -- nearest double of the text is within 256 ns of it) is a full bucket whatever
            -- its exact value; else the exact pair from that double and the last 9 digits:
            -- (x - n) / 1e9 is within 1e-6 of the whole seconds.
            local x = tonumber(ft)
            if x < ns * G + nn - 1024 then return full_level(L, ns, nn, into) end
            fn = tonumber(ssub(ft, -9))
            fs = floor((x - fn) / G + 0.5)
            if fs > ns or (fs == ns and fn > nn) then
                -- Not full by now: refill's common case inline (the deficit clearly less
                -- than the fill time: at now, nothing behind).
                local ds, dn = fs - ns, fn - nn
                if dn < 0 then ds, dn = ds - 1, dn + G end
                local cf = L.cf
                if not cf then
                    cf = L.c * G / L.r * (1 - 1e-9) -- clearly_below(L, _, L.c)'s bound
                    L.cf = cf
                end
                if into and ds * G + dn < cf then
                    into.L, into.as, into.an, into.bs, into.bn = L, ns, nn, 0, 0
                    into.ds, into.dn, into.ss, into.sn = ds, dn, 0, 0
                    return into
                end
            end
            return refill(fs, fn, L, ns, nn, into)
        end
        fs, fn = parse_instant(ft)
        if h[H] then
            hs, hn = parse_instant(h[H])
            ss, sn = parse_instant(h[S] or '0')
        end
        return level_new(fs, fn, L, L, ns, nn, hs, hn, ss, sn, into)
    end
    if init then return starting_with(L, init, ns, nn, into), v end
    return full_level(L, ns, nn, into), v
end

-- Whether a call's bucket must be written even if it is denied: a new bucket that starts
-- below full (INIT), or a stored one whose limit a newer version replaced (`wv`).
local function must_write(h, lv, wv)
    if h[F] then return wv ~= nil end
    local s, n = reset_after(lv)
    return s ~= 0 or n ~= 0
end

-- The module's check that n (or MIN) fits the limit deciding the call: a stale call under a
-- stored limit with a smaller cap (L is the call's own, already checked).
local function fits_decided(n, lv, L, what)
    if lv.L ~= L and n > lv.L.c then fail(what) end
end

-- The level of a stored bucket under its own limit (RETURN, PEEK, REFUND).
local function level_stored(h, ns, nn)
    return level_of(h, stored_texts(h[R], h[C]), nil, ns, nn, SCRATCH)
end

-- The key's expiry, ms: ceil_ms(max(full_at, hold, x)) (x: the last lease expiry, us).
local function expiry_ms(lv, x)
    local fs, fn = full_at(lv)
    if lv.ss ~= 0 or lv.sn ~= 0 then
        local hs, hn = hold_at(lv)
        if lt(fs, fn, hs, hn) then fs, fn = hs, hn end
    end
    local ms = ceil_ms(fs, fn)
    if x then
        local xm = ceil(x / 1000)
        if xm > ms then return xm end
    end
    return ms
end

-- Whether the bucket, once written, could go: full and past its hold (RETURN, REFUND).
local function gone_at(lv, ns, nn)
    local rs, rn = reset_after(lv)
    if rs ~= 0 or rn ~= 0 then return false end
    local hs, hn = hold_at(lv)
    return not lt(ns, nn, hs, hn)
end

-- The HSET arguments of the bucket's fields (f always, r c when the limit is new, v when
-- the version is (`wv`), h s when there is a span), then HDEL of h s when they are stored
-- and no longer wanted, and the expiry. `extra` adds fields (the lease table's).
local function write(key, h, lv, extra, drop, wv)
    local L = lv.L
    local fs, fn = full_at(lv)
    local args = { key, 'f', instant_text(fs, fn) }
    local k = 3
    -- A stored pin (h[P]): h may be the bucket as it stands without it (`Pn.pin_of`), not
    -- the stored fields; every field is written, and p as `h.pw` says (nil: it goes).
    local pinned, fresh = h[P], h.str
    if fresh then
        -- A string bucket that needs a field the string has not: a hash from now on.
        call('DEL', key)
        h.str = nil
    end
    if fresh or pinned or not (h[F] and h[R] == L.rt and h[C] == L.ct) then
        args[4] = 'r'; args[5] = L.rt; args[6] = 'c'; args[7] = L.ct
        k = 7
    end
    if wv then
        args[k + 1] = 'v'; args[k + 2] = fmt('%d', wv)
        k = k + 2
    end
    local spanned = lv.ss ~= 0 or lv.sn ~= 0
    if spanned then
        args[k + 1] = 'h'; args[k + 2] = instant_text(hold_at(lv))
        args[k + 3] = 's'; args[k + 4] = instant_text(lv.ss, lv.sn)
        k = k + 4
    end
    if h.pw then
        args[k + 1] = 'p'; args[k + 2] = h.pw
        k = k + 2
    end
    if extra then
        for j = 1, #extra do args[k + j] = extra[j] end
    end
    call('HSET', unpack(args))
    if drop or pinned then
        drop = drop or { key }
        if not spanned and (h[H] or h[S] or pinned) then
            drop[#drop + 1] = 'h'; drop[#drop + 1] = 's'
        end
        if pinned and not h.pw then drop[#drop + 1] = 'p' end
        if #drop > 1 then call('HDEL', unpack(drop)) end
    elseif not spanned and (h[H] or h[S]) then
        call('HDEL', key, 'h', 's')
    end
end

-- The expiry after a write: `ms` (expiry_ms), or a pin's end if later, or none for a pin
-- without an end (the module's key then has no expiry: a pinned key stays while pinned).
-- A rate pin with an end that returns the bucket to another limit keeps the key until the
-- bucket it leaves behind is full instead (Bucket::expires_at): `st` is the bucket written
-- ({fs, fn, L, hs, hn, ss, sn}), `x` its last lease's expiry (us, or nil).
local function expire(key, h, ms, st, x)
    if h.pw then
        if h.pnone then
            call('PERSIST', key)
            return
        end
        local pm = ceil_ms(h.pus, h.pun)
        local pin = st and Pn.parse_pin(h.pw)
        if pin and pin.k == 1 and not pin.absent
            and not (pin.B.r == st[3].r and pin.B.c == st[3].c) then
            -- pin.rs `ended`: the level at the pin's end moved to its base there; only the
            -- bucket's own hold, if it outlives the end, keeps the key besides.
            local us, un = pin.us, pin.un
            if us == 0 and un == 0 then un = 1 end
            local back = level_new(st[1], st[2], st[3], pin.B, us, un, st[4], st[5], st[6], st[7])
            local es, en = full_at(back)
            if lt(us, un, st[4], st[5]) and lt(es, en, st[4], st[5]) then es, en = st[4], st[5] end
            ms = ceil_ms(es, en)
            if x then
                local xm = ceil(x / 1000)
                if xm > ms then ms = xm end
            end
        end
        if pm > ms then ms = pm end
    end
    call('PEXPIREAT', key, ms_arg(ms))
end

-- The bucket level lv writes, as `expire` reads it.
local function written(lv)
    local fs, fn = full_at(lv)
    local hs, hn = 0, 0
    if lv.ss ~= 0 or lv.sn ~= 0 then hs, hn = hold_at(lv) end
    return { fs, fn, lv.L, hs, hn, lv.ss, lv.sn }
end

-- Writes the bucket (leases untouched). The expiry is set on every write, whatever the
-- state implied before: PERSIST or RESTORE ... 0 may have removed it. The expiry (ms, an
-- integer below 2^53) goes to PEXPIREAT as a Lua number on Redis >= 7.2 and Valkey, which
-- format it as an integer (ll2string); Redis 7.0 formats a number with %.17g (plain digits
-- too, but several times the cost of string.format's %d), so there it goes as text
-- (`ms_arg`, chosen at the first call).
-- `wv`: the version to store (nil: the stored one stays).
local function store(key, h, lv, wv)
    -- Set, not compared: reading PEXPIRETIME to skip an unchanged expiry measured no
    -- cheaper than setting it (functions/bench.py; docs/functions.md).
    local L = lv.L
    if lv.ss == 0 and lv.sn == 0 and not h[X] and not wv and not h[P] and not h.pw then
        -- The hot paths: no span, no lease, no version to write, no pin.
        local fs, fn = lv.as + lv.ds, lv.an + lv.dn
        if fn >= G then fs, fn = fs + 1, fn - G end
        local ms = fs * 1000 + ceil(fn / 1e6)
        if MS_TEXT then ms = fmt('%d', ms) end
        if h.str or h.none or (h.all and not (h[H] or h[S] or h[I] or h[LS] or h[V])) then
            -- A plain bucket: the string, value and expiry in one call (see `get_bucket`).
            call('SET', key, (L.tag or Ly.tag_of(L)) .. Ly.pack('<dI4', fs, fn), 'PXAT', ms)
            return
        end
        if h[F] and not h[H] and not h[S] and h[R] == L.rt and h[C] == L.ct then
            -- A hash with the same limit (it keeps fields the string has not): f and the
            -- expiry (full_at).
            call('HSET', key, 'f', instant_text(fs, fn))
            call('PEXPIREAT', key, ms)
            return
        end
    end
    write(key, h, lv, nil, nil, wv)
    local x = h[X] and tonumber(h[X])
    expire(key, h, expiry_ms(lv, x), h.pw and written(lv), x)
end

-- Lease tables: { last = id, {id, tokens, exp_us}... } from fields i and l.
local function parse_table(i, l)
    local t = { last = tonumber(i) or 0 }
    if l then
        for id, tok, exp in gmatch(l, '(%d+):(%d+):(%d+)') do
            t[#t + 1] = { tonumber(id), tonumber(tok), tonumber(exp) }
        end
    end
    return t
end

local function table_text(t)
    local parts, x = {}, nil
    for k = 1, #t do
        local e = t[k]
        parts[k] = fmt('%d:%d:%d,', e[1], e[2], e[3])
        if not x or e[3] > x then x = e[3] end
    end
    return table.concat(parts), x
end

local function prune(t, now_us)
    local kept = { last = t.last }
    for k = 1, #t do
        if t[k][3] > now_us then kept[#kept + 1] = t[k] end
    end
    return kept
end

local function find_live(t, id, now_us)
    for k = 1, #t do
        local e = t[k]
        if e[1] == id then
            if e[3] > now_us then return k, e end
            return nil
        end
    end
    return nil
end

local function count_live(t, now_us)
    local c, held = 0, 0
    for k = 1, #t do
        if t[k][3] > now_us then c = c + 1; held = held + t[k][2] end
    end
    return c, held
end

-- Writes the bucket and its lease table: `text` (nil: no entry left, the fields go), `x`
-- the latest expiry in it, `last` the last lease id.
local function store_leases(key, h, lv, text, x, last, wv)
    local extra = {}
    if last ~= 0 then
        extra[1] = 'i'; extra[2] = fmt('%d', last)
    end
    if x then
        extra[#extra + 1] = 'l'; extra[#extra + 1] = text
        extra[#extra + 1] = 'x'; extra[#extra + 1] = fmt('%d', x)
    end
    local drop = { key }
    if not x and (h[X] or h[LS]) then drop[2] = 'l'; drop[3] = 'x' end
    write(key, h, lv, extra, drop, wv)
    expire(key, h, expiry_ms(lv, x), h.pw and written(lv), x)
end

-- A take of a string bucket under its own limit, or of no key (full_at 0: a full bucket),
-- no VERSION (the common cases): the level from the exact pair (level_of's same-limit
-- case, without a text to parse), the write a string (`store`). One table, Ly.h, stands for every such bucket (`store` reads only
-- h.str of it; a new table per call measured 1k instructions dearer).
function Ly.take(key, L, n, with_state, shadow, fs, fn, ns, nn)
    local lv
    if fs < ns or (fs == ns and fn <= nn) then
        lv = full_level(L, ns, nn, SCRATCH)
    else
        local ds, dn = fs - ns, fn - nn
        if dn < 0 then ds, dn = ds - 1, dn + G end
        local cf = L.cf
        if not cf then
            cf = L.c * G / L.r * (1 - 1e-9) -- clearly_below(L, _, L.c)'s bound
            L.cf = cf
        end
        if ds * G + dn < cf then
            lv = SCRATCH
            lv.L, lv.as, lv.an, lv.bs, lv.bn = L, ns, nn, 0, 0
            lv.ds, lv.dn, lv.ss, lv.sn = ds, dn, 0, 0
        else
            lv = refill(fs, fn, L, ns, nn, SCRATCH)
        end
    end
    local granted = try_take(lv, n)
    if granted then store(key, Ly.h, lv) end
    -- SHADOW: decided and written as when enforcing, a denial answered as a grant.
    local answered = granted or shadow
    local reply = answered and n or 0
    if not with_state then return reply end
    local retry = 0
    if not answered then retry = wait_ms(wait_for(lv, n)) end
    return { reply, { double = signed_tokens(lv) }, retry, ceil_ms(reset_after(lv)) }
end

-- Writes bucket and table.
local function store_with_leases(key, h, lv, t, wv)
    local text, x = table_text(t)
    store_leases(key, h, lv, x and text, x, t.last, wv)
end

-- ---------------------------------------------------------------------------------------
-- Pins (core/src/pin.rs): RL.PIN's limit on a key, applied by every call on it.
--
-- A pinned bucket keeps its fields (a rate pin's f r c are the bucket under the pinned
-- limit) and one more, p: "kind until absent [base_rate base_cap]", kind 1 rate, 2 block,
-- 3 exempt; until the end in ns as decimal text (0: at RL.UNPIN); absent 1 for a key that
-- holds only the pin (then the hash is p alone: no f); a rate pin's base is the limit the
-- bucket returns to, as texts. A hash without p is unpinned: every key written before pins
-- reads as it did.

-- `[PX ms]` from argument `from` to the last (`na`): the pin's length in ms, 0 for none.
function Pn.px(a, na, from, N)
    local rest = na + 1 - from
    -- `PX ms PX ...`: the option twice (its first value checked first), as the module.
    if rest >= 3 and is(a[from], 'PX') and is(a[from + 2], 'PX') then
        positive(a, from + 1, N, 'PX must be a positive integer (ms)')
        twice(a[from + 2])
    end
    if rest == 2 and is(a[from], 'PX') then
        return positive(a, from + 1, N, 'PX must be a positive integer (ms)')
    elseif rest == 1 or rest == 2 then
        unknown(a[from])
    elseif rest ~= 0 then
        arity(N)
    end
    return 0
end

Pn.KIND_NAME = { 'rate', 'block', 'exempt' }
-- BLOCKED_RETRY: the wait a BLOCK without an end answers, as a pair.
Pn.BLOCKED_S = 60

function Pn.parse_pin(t)
    local k, u, ab, rest = t:match('^([123]) (%d+) ([01])(.*)$')
    if not k or #u > 19 then not_a_bucket('its field p is not a pin') end
    local pin = { k = tonumber(k), absent = ab == '1', ut = u, none = (u == '0') }
    pin.us, pin.un = parse_instant(u)
    if pin.k == 1 then
        local brt, bct = rest:match('^ (%S+) (%S+)$')
        if not brt then not_a_bucket('its field p is not a pin') end
        pin.B = stored_texts(brt, bct)
    elseif rest ~= '' then
        not_a_bucket('its field p is not a pin')
    end
    return pin
end

function Pn.pin_text(k, ut, absent, B)
    local t = fmt('%d %s %s', k, ut, absent and '1' or '0')
    if B then t = t .. ' ' .. B.rt .. ' ' .. B.ct end
    return t
end

function Pn.pin_live(pin, ns, nn) return pin.none or lt(ns, nn, pin.us, pin.un) end

-- The pin carried unchanged by a write (its text `t`).
function Pn.keep_pin(h, pin, t)
    h.pw, h.pnone, h.pus, h.pun = t, pin.none, pin.us, pin.un
end

function Pn.hold_of(h)
    if h[H] then
        local hs, hn = parse_instant(h[H])
        local ss, sn = parse_instant(h[S] or '0')
        return hs, hn, ss, sn
    end
    return 0, 0, 0, 0
end

-- h (the stored fields) made the bucket as it stands once `pin` ended at `at` (pin.rs
-- `ended`): a rate pin's tokens carried over into its base at that instant; a key that
-- held only the pin as absent (h.bare: no INIT applies, as to no stored bucket). h[P]
-- stays (the stored pin goes at the write).
function Pn.end_pin(h, pin, as, an)
    if pin.absent then
        h[F] = false
        h.bare = true
        return
    end
    if pin.k ~= 1 then return end
    local Pl = stored_texts(h[R], h[C])
    local B = pin.B
    if B.r == Pl.r and B.c == Pl.c then return end
    if as == 0 and an == 0 then an = 1 end
    local fs, fn = parse_instant(h[F])
    local hs, hn, ss, sn = Pn.hold_of(h)
    local lv = level_new(fs, fn, Pl, B, as, an, hs, hn, ss, sn)
    h[F] = instant_text(full_at(lv))
    h[R], h[C] = B.rt, B.ct
    -- Only the bucket's own hold keeps the key (no caller passes the pinned limit, so its
    -- fill time is no reason to keep an idle key).
    if (ss ~= 0 or sn ~= 0) and lt(as, an, hs, hn) then
        h[H] = instant_text(hs, hn)
        h[S] = instant_text(ss, sn)
    else
        h[H], h[S] = false, false
    end
end

-- The stored pin of h at now: the live pin (its parsed fields), or nil once h is made the
-- bucket without an ended one (`Pn.end_pin`).
function Pn.pin_of(h, ns, nn)
    local pin = Pn.parse_pin(h[P])
    if Pn.pin_live(pin, ns, nn) then return pin end
    Pn.end_pin(h, pin, pin.us, pin.un)
    return nil
end

-- The level a call with limit L at version v (nil: 0) is decided on under a live pin
-- (pin.rs `open`), and the version a write must store (a rate pin: a newer VERSION, which
-- replaces the limit kept aside, stored even on a denial). Sets the pin a write keeps.
function Pn.level_pinned(h, pin, L, v, ns, nn, into, key)
    if pin.k == 1 then
        if pin.absent then
            -- The key held nothing when it was pinned (pin.rs `open_pinned`): the bucket it
            -- stands for is full under the caller's limit, carried over into the pinned one
            -- now (min of the caps: never fuller than unpinned). The caller's limit and
            -- version become what the bucket returns to; a version is new to the key.
            v = v or 0
            Pn.keep_pin(h, pin, Pn.pin_text(1, pin.ut, false, L))
            return level_new(ns, nn, L, pin.B, ns, nn, 0, 0, 0, 0, into), v > 0 and v or nil
        end
        local Pl = stored_texts(h[R], h[C])
        if h[V] == nil then h[V] = call('HGET', key, 'v') end
        local sv = stored_version(h[V])
        v = v or 0
        local base, wv = pin.B, nil
        if v > sv then base, wv = L, v elseif v == sv then base = L end
        Pn.keep_pin(h, pin, Pn.pin_text(1, pin.ut, false, base))
        local fs, fn = parse_instant(h[F])
        local hs, hn, ss, sn = Pn.hold_of(h)
        return level_new(fs, fn, Pl, Pl, ns, nn, hs, hn, ss, sn, into), wv
    end
    Pn.keep_pin(h, pin, h[P])
    if pin.absent then return full_level(L, ns, nn, into), nil end
    local B = stored_texts(h[R], h[C])
    local fs, fn = parse_instant(h[F])
    local hs, hn, ss, sn = Pn.hold_of(h)
    return level_new(fs, fn, B, B, ns, nn, hs, hn, ss, sn, into), nil
end

-- The level of a stored bucket for the calls that give no limit (RETURN, REFUND, PEEK):
-- under its live pin (returned, kept by a write), or as it stands without an ended one.
-- nil: the key holds only a pin (live or ended), as absent.
function Pn.level_stored_pinned(h, ns, nn)
    local pin = Pn.pin_of(h, ns, nn)
    if not h[F] then return nil end
    if pin then Pn.keep_pin(h, pin, h[P]) end
    return level_of(h, stored_texts(h[R], h[C]), nil, ns, nn, SCRATCH), pin
end

-- A call needing n tokens at once under a live rate pin whose cap is below them is denied
-- as a BLOCK denies (pin::over_cap_gate): marked `over` for this call.
function Pn.mark_over_cap(pin, lv, n)
    if pin and pin.k == 1 and n > lv.L.c then pin.over = true end
end

-- The wait a caller is told under a live pin for n tokens (Level::wait_for with a gate):
-- a BLOCK's (or an over-cap call's) time left (at least 1 ns; 60 s without an end), none for an EXEMPT key (it
-- grants what the caller's own limit allows, whatever its bucket's), else the level's own.
function Pn.pinned_wait(lv, pin, n, ns, nn)
    if pin and (pin.k == 2 or pin.over) then
        if pin.none then return Pn.BLOCKED_S, 0 end
        local s, w = sat_sub(pin.us, pin.un, ns, nn)
        if s == 0 and w == 0 then w = 1 end
        return s, w
    end
    if pin and pin.k == 3 then return 0, 0 end
    return wait_for(lv, n)
end

-- ---------------------------------------------------------------------------------------
-- Commands.

-- A number as Rust's Display writes an f64: the shortest digits that read back as it, never
-- an exponent.
local function plain(x)
    local s
    for p = 1, 17 do
        s = string.format('%.' .. p .. 'g', x)
        if tonumber(s) == x then break end
    end
    local mant, e = s:match('^(-?[%d.]+)e([-+]%d+)$')
    if not mant then return s end
    local neg = mant:sub(1, 1) == '-'
    if neg then mant = mant:sub(2) end
    local int, frac = mant:match('^(%d+)%.?(%d*)$')
    local digits = int .. frac
    local point = #int + tonumber(e)
    local out
    if point <= 0 then
        out = '0.' .. string.rep('0', -point) .. digits
    elseif point >= #digits then
        out = digits .. string.rep('0', point - #digits)
    else
        out = digits:sub(1, point) .. '.' .. digits:sub(point + 1)
    end
    return (neg and '-' or '') .. out
end

-- `RL.TAKE key 15 30 60` is redis-cell's habit (`CL.THROTTLE key max_burst count period`):
-- the n-over-cap error then says what the same limit is here (src/bucket/take.rs).
local function redis_cell_hint(a, na)
    if na ~= 3 then return nil end
    local burst, count, period = parse_integer(a[1]), parse_number(a[2]), parse_integer(a[3])
    if not burst or not count or not period or period == 0 or count ~= count or count <= 0
        or burst >= 2 ^ 53 then
        return nil
    end
    -- Only a call that works here is suggested: the rate and cap must be ones RL.TAKE takes.
    local rate, cap = count / period, burst + 1
    if not (in_range(rate) and in_range(cap) and cap / rate <= MAX_FILL_SECS) then return nil end
    return 'n must not exceed cap (if these are redis-cell\'s max_burst count period, the same '
        .. 'limit here is RL.TAKE key ' .. plain(count / period) .. ' '
        .. string.format('%d', burst + 1) .. ': rate in tokens per second, cap = max_burst + 1)'
end

-- RL.TAKE's options after rate and cap: [n] [WITHSTATE] [INIT tokens] [SHADOW] [VERSION v].
-- Returns n, with_state, init, version (nil for none or 0), shadow.
local function take_options(a, na, L, N)
    local n, with_state, init, v, v_given, shadow = 1, false, nil, nil, false, false
    local i = 3
    while i <= na do
        local o = a[i]
        if is(o, 'VERSION') then
            once(v_given, o)
            v_given = true
            v = version_at(a, i + 1, N)
            i = i + 1
        elseif is(o, 'WITHSTATE') then
            once(with_state, o)
            with_state = true
        elseif is(o, 'SHADOW') then
            once(shadow, o)
            shadow = true
        elseif is(o, 'INIT') then
            once(init ~= nil, o)
            init = init_tokens(a, i + 1, L, N)
            i = i + 1
        elseif i == 3 and looks_numeric(o) then
            n = positive(a, i, N, 'n must be a positive integer')
        else
            unknown(o)
        end
        i = i + 1
    end
    if n > L.c then fail(redis_cell_hint(a, na) or 'n must not exceed cap') end
    return n, with_state, init, v, shadow
end

-- RL.TAKE on a key with a live pin: a rate pin decides as the level does, BLOCK denies,
-- EXEMPT grants without a debit (nothing written); WITHSTATE says which (a fifth element).
function Pn.take_pinned(key, h, pin, L, n, with_state, v, shadow, ns, nn)
    local lv, wv = Pn.level_pinned(h, pin, L, v, ns, nn, SCRATCH, key)
    local granted
    if pin.k == 1 then
        Pn.mark_over_cap(pin, lv, n)
        granted = not pin.over and try_take(lv, n)
        if granted or wv then store(key, h, lv, wv) end
    elseif pin.k == 2 then
        granted = false
    else
        granted = true -- the caller's own cap was checked: n fits it
    end
    local answered = granted or shadow
    local reply = answered and n or 0
    if not with_state then return reply end
    local retry = 0
    if not answered then retry = wait_ms(Pn.pinned_wait(lv, pin, n, ns, nn)) end
    return { reply, { double = signed_tokens(lv) }, retry, ceil_ms(reset_after(lv)),
        Pn.KIND_NAME[pin.k] }
end

-- RL.TAKE on `key` once its arguments are parsed and valid. WRONGTYPE, and n above a
-- stored newer limit's cap, are returned as the reply; a hash that is not a bucket raises
-- (`stored_texts`).
local function take(key, L, n, with_state, init, v, shadow)
    local ns, nn = now()
    -- `get_bucket` with its common case inline: a string under the call's limit.
    local h
    local g = pcall_r('GET', key)
    if type(g) == 'string' then
        local tn = L.tn
        if not tn then
            Ly.tag_of(L)
            tn = L.tn
        end
        if not v and sfind(g, L.tag, 1, true) == 1 then -- a prefix compare, no new string
            local fs, fn = Ly.pair(g, tn)
            if not fs then return { err = Ly.WRONG } end
            return Ly.take(key, L, n, with_state, shadow, fs, fn, ns, nn)
        else
            h = Ly.string_bucket(g)
            if not h then return { err = Ly.WRONG } end
        end
    elseif not g then
        -- No key: a full bucket (level_of's case of no stored bucket), unless INIT.
        if not v and not init then return Ly.take(key, L, n, with_state, shadow, 0, 0, ns, nn) end
        h = { none = true }
    else
        h = Ly.hmget_all(key)
        if h.err then return h end
    end
    -- `checked`'s common case inline (this runs on every take): an `f` of digits, no other
    -- field to check.
    local ft = h[F]
    if not ft or h[H] or h[S] or h[X] or h[P] or ft == '' or #ft > 19 or sfind(ft, '%D') then
        checked(h, key)
    end
    local pin = h[P] and Pn.pin_of(h, ns, nn)
    if pin then return Pn.take_pinned(key, h, pin, L, n, with_state, v, shadow, ns, nn) end
    if h.bare then init = nil end
    local lv, wv = level_of(h, L, init, ns, nn, SCRATCH, v, key)
    if lv.L ~= L and n > lv.L.c then return error_reply('ERR n must not exceed cap') end
    local created = (wv or not h[F]) and must_write(h, lv, wv)
    local granted = try_take(lv, n)
    if granted or created then store(key, h, lv, wv) end
    -- SHADOW: decided and written as when enforcing, a denial answered as a grant.
    local answered = granted or shadow
    local reply = answered and n or 0
    if not with_state then return reply end
    local retry = 0
    if not answered then retry = wait_ms(wait_for(lv, n)) end
    return { reply, { double = signed_tokens(lv) }, retry, ceil_ms(reset_after(lv)) }
end

local function rl_take(keys, a)
    local N = 'RL.TAKE'
    local na = #a
    if #keys ~= 1 or na < 2 or na > 9 then arity(N) end
    local L = limit_at(a, 1, N)
    local n, with_state, init, v, shadow = take_options(a, na, L, N)
    return take(keys[1], L, n, with_state, init, v, shadow)
end

-- The plain call `FCALL rl_take 1 key rate cap n` whose limit and n were parsed and
-- validated before (LIMITS, INTS): nothing left to check, so it is taken without the
-- option parser and outside the boundary's pcall (nothing on that path raises). Any other
-- call (a new limit or n, options, errors): nil, and rl_take parses it.
local function quick_take(keys, a)
    if #a ~= 3 or #keys ~= 1 then return nil end
    local byr = LIMITS[a[1]]
    local L = byr and byr[a[2]]
    local n = INTS[a[3]]
    if not L or not n or n <= 0 or n > L.c then return nil end
    return take(keys[1], L, n, false, nil)
end

-- A lease table shorter than this holds fewer than 683 entries (each is at least
-- "1:1:1,"), below MAX_LEASES: a lease call appends its lease to such a table without
-- parsing it all. Entries are in id order, which is the order they were granted in, so
-- with one TTL the expired ones are a prefix: the call drops that prefix and leaves any
-- other expired entry (they count for nothing: every reader skips them) for a call that
-- finds the table longer, which parses and prunes it all.
local PRUNE_CHARS = 4096

-- `text` without its leading expired entries (nil if none is left).
local function drop_expired_prefix(text, now_us)
    local at = 1
    while true do
        local _, e, exp = sfind(text, '^%d+:%d+:(%d+),', at)
        if not e or tonumber(exp) > now_us then break end
        at = e + 1
    end
    if at == 1 then return text end
    if at > #text then return nil end
    return ssub(text, at)
end

-- RL.LEASE on `key` once its arguments are parsed and valid.
local function lease(key, L, n, ttl, min, ret_id, ret_unused, init, v, shadow)
    local ns, nn, now_us = now()
    local h = read_leases(key, v)
    local pin = h[P] and Pn.pin_of(h, ns, nn)
    local lv, wv
    if pin then
        lv, wv = Pn.level_pinned(h, pin, L, v, ns, nn, SCRATCH, key)
        if pin.k == 3 then
            -- EXEMPT: the whole lease up to the caller's cap, nothing debited or recorded
            -- (id 0: nothing to return).
            local got = math.min(n, floor(L.c))
            if got < min then got = min end
            return { got, 0, ttl, 0 }
        end
        Pn.mark_over_cap(pin, lv, min)
    else
        if h.bare then init = nil end
        lv, wv = level_of(h, L, init, ns, nn, SCRATCH, v, key)
        fits_decided(min, lv, L, 'MIN must not exceed cap')
    end
    local blocked = pin and (pin.k == 2 or pin.over)
    local created = must_write(h, lv, wv)
    local text, x, last = h[LS], tonumber(h[X]), tonumber(h[I]) or 0
    if x and x <= now_us then text, x = nil, nil end -- every lease in it has expired
    -- `live`: the live leases, or (a short table, not parsed) a bound on them below
    -- MAX_LEASES, which decides the same.
    local live, returned = 0, nil -- returned: the credit of the lease being returned
    if text and not ret_id then
        text = drop_expired_prefix(text, now_us)
        if not text then x = nil end
    end
    -- A table without its `x` (not one this library wrote) is parsed whole: appending
    -- would take the new lease's expiry for the latest and expire the key too early.
    if text and (ret_id or not x or #text >= PRUNE_CHARS) then
        local t = prune(parse_table(nil, text), now_us)
        if ret_id then
            local k, e = find_live(t, ret_id, now_us)
            if k then
                returned = math.min(ret_unused, e[2])
                table.remove(t, k)
            end
        end
        live = #t
        text, x = table_text(t)
        if not x then text = nil end
    elseif text then
        live = floor(#text / 6) -- at most this many entries: below MAX_LEASES
    end
    if returned then credit(lv, returned) end
    local got = 0
    if live < MAX_LEASES and not blocked then got = take_up_to(lv, n, min) end
    if got == 0 and live >= MAX_LEASES and not returned then
        fail('too many live leases on this key (at most 1024)')
    end
    if got > 0 or returned or created then
        local id = 0
        if got > 0 then
            id = math.max(last + 1, now_us)
            last = id
            local exp = now_us + ttl * 1000
            text = (text or '') .. fmt('%d:%d:%d,', id, got, exp)
            if not x or exp > x then x = exp end
        end
        store_leases(key, h, lv, text, x, last, wv)
        if got > 0 then return { got, id, ttl, 0 } end
    end
    -- SHADOW: a denial answers n under no lease (id 0): nothing recorded, nothing to return.
    if shadow then return { n, 0, ttl, 0 } end
    return { 0, 0, 0, wait_ms(Pn.pinned_wait(lv, pin, min, ns, nn)) }
end

local function rl_lease(keys, a)
    local N = 'RL.LEASE'
    local na = #a
    if na == 4 and #keys == 1 then
        -- The plain call `rl_lease 1 key rate cap n ttl_ms` with a limit and integers
        -- parsed and validated before (LIMITS, INTS): no option parser.
        local byr = LIMITS[a[1]]
        local L = byr and byr[a[2]]
        local n, ttl = INTS[a[3]], INTS[a[4]]
        if L and n and ttl and n > 0 and ttl > 0 and ttl <= MAX_TTL_MS and L.c >= 1 then
            return lease(keys[1], L, n, ttl, 1, nil, nil, nil, nil)
        end
    end
    if #keys ~= 1 or na < 4 then arity(N) end
    local L = limit_at(a, 1, N)
    local n = positive(a, 3, N, 'n must be a positive integer')
    local ttl = positive(a, 4, N, 'ttl_ms must be a positive integer')
    if ttl > MAX_TTL_MS then fail('ttl_ms must be at most 86400000 (a day)') end
    local min, min_text, ret_id, ret_unused, init = 1, '1', nil, nil, nil
    local min_given, v, v_given, shadow = false, nil, false, false
    local i = 5
    while i <= na do
        local o = a[i]
        if is(o, 'VERSION') then
            once(v_given, o)
            v_given = true
            v = version_at(a, i + 1, N)
            i = i + 2
        elseif is(o, 'MIN') then
            once(min_given, o)
            min_given = true
            min = positive(a, i + 1, N, 'MIN must be a positive integer')
            min_text = a[i + 1]
            i = i + 2
        elseif is(o, 'RETURN') then
            once(ret_id ~= nil, o)
            ret_id = integer(a, i + 1, N, 'lease_id must be a non-negative integer')
            ret_unused = integer(a, i + 2, N, 'unused must be a non-negative integer')
            i = i + 3
        elseif is(o, 'SHADOW') then
            once(shadow, o)
            shadow = true
            i = i + 1
        elseif is(o, 'INIT') then
            once(init ~= nil, o)
            init = init_tokens(a, i + 1, L, N)
            i = i + 2
        else
            unknown(o)
        end
    end
    if int_gt(min_text, a[3]) then fail('MIN must not exceed n') end
    fits(min, L, 'MIN must not exceed cap')
    return lease(keys[1], L, n, ttl, min, ret_id, ret_unused, init, v, shadow)
end

local function rl_return(keys, a)
    local N = 'RL.RETURN'
    if #keys ~= 1 or #a ~= 2 then arity(N) end
    local id = integer(a, 1, N, 'lease_id must be a non-negative integer')
    local unused = integer(a, 2, N, 'unused must be a non-negative integer')
    local key = keys[1]
    local ns, nn, now_us = now()
    local h = read_leases(key)
    if not h[F] then return 0 end -- no key, or one that holds only a pin
    stored_texts(h[R], h[C]) -- a hash with no valid limit is no bucket
    if h[P] then Pn.parse_pin(h[P]) end -- nor one with no valid pin
    if not h[LS] then return 0 end
    local t = parse_table(h[I], h[LS])
    local _, e = find_live(t, id, now_us)
    if not e then return 0 end
    t = prune(t, now_us)
    local k = find_live(t, id, now_us)
    table.remove(t, k)
    local credited = math.min(unused, e[2])
    local lv, pin
    if h[P] then lv, pin = Pn.level_stored_pinned(h, ns, nn) else lv = level_stored(h, ns, nn) end
    -- credit_up_to: a bucket that refilled meanwhile takes back only what it lacks, and
    -- one in debt nothing (nor one EXEMPT: its grants debited nothing).
    local missing = ceil(tokens_for(lv.L, lv.ds, lv.dn))
    if lv.bs ~= 0 or lv.bn ~= 0 or (pin and pin.k == 3) then missing = 0 end
    if missing > 0 then credit(lv, credited) end
    credited = math.min(credited, missing)
    if #t == 0 and not pin and gone_at(lv, ns, nn) then
        -- Full, no lease left and past its hold: the same as no key at all.
        call('DEL', key)
    else
        store_with_leases(key, h, lv, t)
    end
    return credited
end

local function rl_mtake(keys, a)
    local N = 'RL.MTAKE'
    local nk, na = #keys, #a
    local e, ws, init_at, v_at, shadow = na, false, nil, nil, false
    while true do
        if e > 1 and is(a[e], 'WITHSTATE') then
            once(ws, a[e])
            ws = true; e = e - 1
        elseif e > 1 and is(a[e], 'SHADOW') then
            once(shadow, a[e])
            shadow = true; e = e - 1
        elseif e > 2 and is(a[e - 1], 'INIT') then
            once(init_at ~= nil, a[e - 1])
            init_at = e; e = e - 2
        elseif e > 2 and is(a[e - 1], 'VERSION') then
            -- One version for every bucket, each compared with its own stored version.
            once(v_at ~= nil, a[e - 1])
            v_at = e; e = e - 2
        else
            break
        end
    end
    if nk == 0 or e - 1 ~= 2 * nk then arity(N) end
    if nk > MAX_BUCKETS then fail('at most 64 buckets per call') end
    local n = positive(a, 1, N, 'n must be a positive integer')
    local v = v_at and version_at(a, v_at, N)
    local limits, init = {}, nil
    for j = 1, nk do
        local L = limit_at(a, 2 * j, N)
        fits(n, L, 'n must not exceed cap')
        if init_at then init = init_tokens(a, init_at, L, N) end
        local name = keys[j]
        for k = 1, j - 1 do
            if keys[k] == name then fail('a key appears twice') end
        end
        limits[j] = L
    end

    local ns, nn = now()
    local hs, levels, created, wvs, pins = {}, {}, {}, {}, {}
    for j = 1, nk do
        -- Each bucket opened, then n checked against the limit deciding it, in key order
        -- (nothing is written before every bucket passed).
        local h = read(keys[j])
        hs[j] = h
        local pin = h[P] and Pn.pin_of(h, ns, nn)
        local lv, wv
        if pin then
            lv, wv = Pn.level_pinned(h, pin, limits[j], v, ns, nn, nil, keys[j])
            Pn.mark_over_cap(pin, lv, n)
        else
            lv, wv = level_of(h, limits[j], not h.bare and init or nil, ns, nn, nil, v, keys[j])
            fits_decided(n, lv, limits[j], 'n must not exceed cap')
        end
        pins[j] = pin or false
        levels[j], wvs[j] = lv, wv
        created[j] = must_write(hs[j], lv, wv)
    end
    local worst, ls, ln = 1, -1, 0
    for j = 1, nk do
        local lv = levels[j]
        local s, w = Pn.pinned_wait(lv, pins[j] or nil, n, ns, nn)
        if s == nil then s, w = HUGE_NS * 4, 0 end
        if not lt(s, w, ls, ln) then worst, ls, ln = j, s, w end -- the last longest wait
    end
    local granted = ls == 0 and ln == 0
    for j = 1, nk do
        -- An EXEMPT key is granted without a debit or a write.
        local exempt = pins[j] and pins[j].k == 3
        local debited = granted and not exempt and try_take(levels[j], n)
        if debited or created[j] then store(keys[j], hs[j], levels[j], wvs[j]) end
    end
    local reply
    if granted or shadow then -- SHADOW: a denial answered as a grant
        reply = { n, false, 0 }
    else
        -- A wait of never (a level that cannot hold n): the module's u64::MAX
        -- ns, in ms rounded up.
        local ms = ls >= HUGE_NS * 4 and 18446744073710 or ceil_ms(ls, ln)
        reply = { 0, keys[worst], ms }
    end
    if ws then
        local rem = {}
        for j = 1, nk do rem[j] = { double = signed_tokens(levels[j]) } end
        reply[4] = rem
    end
    return reply
end

-- Token budgets (RL.BUDGET, RL.SETTLE), in one table: Lua allows a chunk 200 locals.
local Bg = {}

-- RL.BUDGET (src/bucket/budget.rs, core/src/budget.rs): `ttl_ms rate cap n` per key (keys
-- first, as FCALL has them), all or nothing, each key its own cost, one reservation id for
-- every key that records one (an EXEMPT key records nothing).
function Bg.rl_budget(keys, a)
    local N = 'RL.BUDGET'
    local nk, na = #keys, #a
    local e, ws, v_at, shadow = na, false, nil, false
    while true do
        if e > 1 and is(a[e], 'WITHSTATE') then
            once(ws, a[e])
            ws = true; e = e - 1
        elseif e > 1 and is(a[e], 'SHADOW') then
            once(shadow, a[e])
            shadow = true; e = e - 1
        elseif e > 2 and is(a[e - 1], 'VERSION') then
            once(v_at ~= nil, a[e - 1])
            v_at = e; e = e - 2
        else
            break
        end
    end
    if nk == 0 or e - 1 ~= 3 * nk then arity(N) end
    if nk > MAX_BUCKETS then fail('at most 64 buckets per call') end
    local ttl = positive(a, 1, N, 'ttl_ms must be a positive integer')
    if ttl > MAX_TTL_MS then fail('ttl_ms must be at most 86400000 (a day)') end
    local v = v_at and version_at(a, v_at, N)
    local limits, costs = {}, {}
    for j = 1, nk do
        local L = limit_at(a, 3 * j - 1, N)
        local n = positive(a, 3 * j + 1, N, 'n must be a positive integer')
        fits(n, L, 'n must not exceed cap')
        local name = keys[j]
        for k = 1, j - 1 do
            if keys[k] == name then fail('a key appears twice') end
        end
        limits[j], costs[j] = L, n
    end

    local ns, nn, now_us = now()
    local hs, levels, created, wvs, pins = {}, {}, {}, {}, {}
    for j = 1, nk do
        -- Every key opened and its cost checked against the limit deciding it, in key
        -- order, before anything is written (as RL.MTAKE).
        local h = read_leases(keys[j], v)
        hs[j] = h
        local pin = h[P] and Pn.pin_of(h, ns, nn)
        local lv, wv
        if pin then
            lv, wv = Pn.level_pinned(h, pin, limits[j], v, ns, nn, nil, keys[j])
            Pn.mark_over_cap(pin, lv, costs[j])
        else
            lv, wv = level_of(h, limits[j], nil, ns, nn, nil, v, keys[j])
            fits_decided(costs[j], lv, limits[j], 'n must not exceed cap')
        end
        pins[j] = pin or false
        levels[j], wvs[j] = lv, wv
        created[j] = must_write(h, lv, wv)
    end
    local worst, ls, ln = 1, -1, 0
    for j = 1, nk do
        local s, w = Pn.pinned_wait(levels[j], pins[j] or nil, costs[j], ns, nn)
        if s == nil then s, w = HUGE_NS * 4, 0 end
        if not lt(s, w, ls, ln) then worst, ls, ln = j, s, w end -- the last longest wait
    end
    local granted = ls == 0 and ln == 0
    -- budget::plan: on a grant, each recording key's live leases pruned and counted, and
    -- one id above every such key's last and the clock.
    local tables, id = {}, 0
    if granted then
        for j = 1, nk do
            if not (pins[j] and pins[j].k == 3) then
                local h = hs[j]
                local t = prune(parse_table(h[I], h[LS]), now_us)
                if #t >= MAX_LEASES then fail('too many live leases on this key (at most 1024)') end
                tables[j] = t
                id = math.max(id, t.last + 1, now_us)
            end
        end
    end
    local exp = now_us + ttl * 1000
    for j = 1, nk do
        local t = tables[j]
        if t then
            try_take(levels[j], costs[j])
            t[#t + 1] = { id, costs[j], exp }
            t.last = id
            store_with_leases(keys[j], hs[j], levels[j], t, wvs[j])
        elseif created[j] then
            store(keys[j], hs[j], levels[j], wvs[j])
        end
    end
    local reply
    if granted then
        reply = { 1, id, false, 0 }
    elseif shadow then -- SHADOW: a denial answered as a grant under no reservation
        reply = { 1, 0, false, 0 }
    else
        local ms = ls >= HUGE_NS * 4 and 18446744073710 or ceil_ms(ls, ln)
        reply = { 0, 0, keys[worst], ms }
    end
    if ws then
        local rem = {}
        for j = 1, nk do rem[j] = { double = signed_tokens(levels[j]) } end
        reply[5] = rem
    end
    return reply
end

-- budget::charge: `over` tokens charged as debt while the time owed stays within
-- budget::most_owed (twice the fill time of the governing limit, never more than twice
-- that of `own`, the key's stored limit: a debt charged under a slow pin must not outlive
-- it as years owed); returns the whole tokens charged.
function Bg.charge(lv, over, own)
    local L = lv.L
    local fs, fn = fill(L)
    local gs, gn = fill(own)
    if lt(gs, gn, fs, fn) then fs, fn = gs, gn end
    local ds, dn = add(fs, fn, fs, fn)
    local os, on = add(lv.bs, lv.bn, lv.ds, lv.dn)
    local rs, rn = sat_sub(ds, dn, os, on)
    local fits_t = floor(tokens_for(L, rs, rn))
    if fits_t < 0 then fits_t = 0 end
    local charged = math.min(over, fits_t)
    if charged > 0 then
        local cs, cn = nanos_for(L, charged)
        if lt(rs, rn, cs, cn) then cs, cn = rs, rn end
        lv.ds, lv.dn = add(lv.ds, lv.dn, cs, cn)
    end
    return charged
end

-- Level::credit_owed: a settle's unused tokens back, in debt too: the time owed (debt
-- included) shrinks by what they refill, never below full; the level taken again at now.
-- Returns the whole tokens credited (at most `back`, at most those missing, rounded up).
function Bg.credit_owed(lv, back, ns, nn)
    local os, on = add(lv.bs, lv.bn, lv.ds, lv.dn)
    local missing = ceil(tokens_for(lv.L, os, on))
    local cs, cn = nanos_for_floor(lv.L, back)
    if lt(os, on, cs, cn) then cs, cn = os, on end
    local fs, fn = full_at(lv)
    fs, fn = sat_sub(fs, fn, cs, cn)
    local m = refill(fs, fn, lv.L, ns, nn, nil)
    lv.as, lv.an, lv.bs, lv.bn, lv.ds, lv.dn = m.as, m.an, m.bs, m.bn, m.ds, m.dn
    return math.min(back, missing)
end

-- RL.SETTLE (src/bucket/settle.rs): `reservation_id actual [actual ...]`, one actual per
-- key. Each key's reservation closed once: the unused part back (credit_owed, in debt
-- too), an overage charged (charge); nil where the key holds no live lease of that id.
function Bg.rl_settle(keys, a)
    local N = 'RL.SETTLE'
    local nk = #keys
    if nk == 0 or #a ~= nk + 1 then arity(N) end
    if nk > MAX_BUCKETS then fail('at most 64 buckets per call') end
    local id = integer(a, 1, N, 'reservation_id must be a non-negative integer')
    local actuals = {}
    for j = 1, nk do
        actuals[j] = integer(a, j + 1, N, 'actual must be a non-negative integer')
        for k = 1, j - 1 do
            if keys[k] == keys[j] then fail('a key appears twice') end
        end
    end
    local ns, nn, now_us = now()
    -- Every key read and checked before any is written: a key of another type fails the
    -- call with nothing settled.
    local hs = {}
    for j = 1, nk do
        local h = read_leases(keys[j])
        if h[F] then
            stored_texts(h[R], h[C])
            if h[P] then Pn.parse_pin(h[P]) end
        end
        hs[j] = h
    end
    local reply = {}
    for j = 1, nk do
        local key, h = keys[j], hs[j]
        local t = h[F] and h[LS] and parse_table(h[I], h[LS])
        local _, e = false, nil
        if t then _, e = find_live(t, id, now_us) end
        if not e then
            reply[j] = false
        else
            t = prune(t, now_us)
            table.remove(t, (find_live(t, id, now_us)))
            local lv, pin
            if h[P] then lv, pin = Pn.level_stored_pinned(h, ns, nn) else lv = level_stored(h, ns, nn) end
            local reserved, actual, signed = e[2], actuals[j], 0
            local exempt = pin and pin.k == 3
            if actual <= reserved then
                if not exempt then signed = Bg.credit_owed(lv, reserved - actual, ns, nn) end
            elseif not exempt then
                -- The key's own limit: a rate pin's base (the bucket is stored under the pin's).
                local own = (pin and pin.k == 1 and pin.B) or stored_texts(h[R], h[C])
                signed = -Bg.charge(lv, actual - reserved, own)
            end
            if #t == 0 and not pin and gone_at(lv, ns, nn) then
                call('DEL', key)
            else
                store_with_leases(key, h, lv, t)
            end
            reply[j] = signed
        end
    end
    return reply
end

local function rl_peek(keys, a)
    if #keys ~= 1 or #a ~= 0 then arity('RL.PEEK') end
    local key = keys[1]
    local ns, nn, now_us = now()
    local h = read(key)
    if not h[F] then return false end
    local lv, pin
    if h[P] then
        lv, pin = Pn.level_stored_pinned(h, ns, nn)
        if not lv then return false end
    else
        lv = level_stored(h, ns, nn)
    end
    local B = lv.L
    local leases, held = count_live(parse_table(nil, h[LS]), now_us)
    return { map = {
        pinned = pin and Pn.KIND_NAME[pin.k] or nil,
        tokens = { double = signed_tokens(lv) },
        rate = { double = B.r },
        cap = { double = B.c },
        reset_after_ms = ceil_ms(reset_after(lv)),
        leases = leases,
        leased_tokens = held,
        version = stored_version(h[V]),
    } }
end

-- RL.RESERVE key rate cap n max_wait_ms [INIT tokens] [VERSION v]: n tokens now, or a reservation of
-- them if they will be there within max_wait_ms (debited now: the bucket goes into debt,
-- which the level carries as `behind`, and later callers queue behind it).
-- Reply [granted, wait_ms, remaining, reset_after_ms]; remaining is negative in debt.
-- SHADOW: decided and written as when enforcing; a denial answered [n, 0, ...].
local function rl_reserve(keys, a)
    local N = 'RL.RESERVE'
    local na = #a
    if #keys ~= 1 or na < 4 then arity(N) end
    local L = limit_at(a, 1, N)
    local n = positive(a, 3, N, 'n must be a positive integer')
    local max_wait = integer(a, 4, N, 'max_wait_ms must be a non-negative integer')
    if max_wait > MAX_TTL_MS then fail('max_wait_ms must be at most 86400000 (a day)') end
    local init, v, v_given, shadow
    local i = 5
    while i <= na do
        if is(a[i], 'SHADOW') then
            once(shadow, a[i])
            shadow = true
            i = i + 1
        elseif is(a[i], 'VERSION') then
            once(v_given, a[i])
            v_given = true
            v = version_at(a, i + 1, N)
            i = i + 2
        elseif is(a[i], 'INIT') then
            once(init ~= nil, a[i])
            init = init_tokens(a, i + 1, L, N)
            i = i + 2
        else
            unknown(a[i])
        end
    end
    fits(n, L, 'n must not exceed cap')

    local key = keys[1]
    local ns, nn = now()
    local h = read(key)
    local pin = h[P] and Pn.pin_of(h, ns, nn)
    local lv, wv
    if pin then
        lv, wv = Pn.level_pinned(h, pin, L, v, ns, nn, SCRATCH, key)
        Pn.mark_over_cap(pin, lv, n)
    else
        if h.bare then init = nil end
        lv, wv = level_of(h, L, init, ns, nn, SCRATCH, v, key)
        fits_decided(n, lv, L, 'n must not exceed cap')
    end
    local created = must_write(h, lv, wv)
    -- Level::reserve: granted if the wait is at most max_wait (exact, in ns); BLOCK denies
    -- whatever the wait, EXEMPT grants with none (nothing debited or written).
    local ws, wn = Pn.pinned_wait(lv, pin, n, ns, nn)
    if ws == nil then fail('n must not exceed cap') end
    local granted = not lt(floor(max_wait / 1000), (max_wait % 1000) * 1e6, ws, wn)
    if pin and (pin.k ~= 1 or pin.over) then granted = pin.k == 3 end
    if granted and not (pin and pin.k == 3) then
        local ts, tn = nanos_for(lv.L, n)
        lv.ds, lv.dn = add(lv.ds, lv.dn, ts, tn)
    end
    if (granted and not (pin and pin.k == 3)) or created then store(key, h, lv, wv) end
    local got, wait = 0, ceil_ms(ws, wn)
    if granted then got = n elseif shadow then got, wait = n, 0 end
    return { got, wait, { double = signed_tokens(lv) }, ceil_ms(reset_after(lv)) }
end

-- RL.REFUND key n: gives back up to n tokens under the stored limit, as many as the
-- bucket lacks (nothing while it is in debt). Reply: the tokens credited (a double; 0 for a missing key).
local function rl_refund(keys, a)
    local N = 'RL.REFUND'
    if #keys ~= 1 or #a ~= 1 then arity(N) end
    local n = positive(a, 1, N, 'n must be a positive integer')
    local key = keys[1]
    local ns, nn = now()
    local h = read(key)
    if not h[F] then return { double = 0 } end
    local lv, pin
    if h[P] then
        lv, pin = Pn.level_stored_pinned(h, ns, nn)
        if not lv then return { double = 0 } end
    else
        lv = level_stored(h, ns, nn)
    end
    -- EXEMPT: nothing was debited, nothing to give back.
    local credited = 0
    if not (pin and pin.k == 3) then credited = refund(lv, n) end
    if not (credited > 0) then return { double = 0 } end
    if not h[LS] and not pin and gone_at(lv, ns, nn) then
        -- Full again, no lease recorded, past its hold: the same as no key.
        call('DEL', key)
    else
        store(key, h, lv)
    end
    return { double = credited }
end

-- RL.PIN key rate cap | BLOCK | EXEMPT [PX ms] (src/bucket/pin.rs): the bucket as it
-- stands now (without any earlier pin) pinned, a rate pin's tokens carried over into the
-- pinned limit. Reply OK.
Pn.MAX_I64_S, Pn.MAX_I64_N = 9223372036, 854775807

-- The fields of a bucket view h (f r c, h s or none), the pin h.pw (nil: none), and the
-- key's expiry: the bucket's, a pin's end if later, none for a pin without an end.
function Pn.write_view(key, h)
    if h.str then
        call('DEL', key) -- a string bucket pinned: a hash from now on (see `write`)
        h.str = nil
    end
    local args = { key, 'f', h[F], 'r', h[R], 'c', h[C] }
    if h[H] then
        args[8] = 'h'; args[9] = h[H]; args[10] = 's'; args[11] = h[S] or '0'
    end
    if h.pw then
        args[#args + 1] = 'p'; args[#args + 1] = h.pw
    end
    call('HSET', unpack(args))
    local del = { key }
    if not h[H] then del[2] = 'h'; del[3] = 's' end
    if not h.pw then del[#del + 1] = 'p' end
    if #del > 1 then call('HDEL', unpack(del)) end
    local ms = ceil_ms(parse_instant(h[F]))
    if h[H] then
        local hm = ceil_ms(parse_instant(h[H]))
        if hm > ms then ms = hm end
    end
    local x = h[X] and tonumber(h[X])
    if x then
        local xm = ceil(x / 1000)
        if xm > ms then ms = xm end
    end
    local st
    if h.pw then
        local fs, fn = parse_instant(h[F])
        local hs, hn, ss, sn = Pn.hold_of(h)
        st = { fs, fn, stored_texts(h[R], h[C]), hs, hn, ss, sn }
    end
    expire(key, h, ms, st, x)
end

-- h made the bucket as level lv left it (its full instant, limit and hold).
function Pn.view_of(h, lv)
    h[F] = instant_text(full_at(lv))
    h[R], h[C] = lv.L.rt, lv.L.ct
    if lv.ss ~= 0 or lv.sn ~= 0 then
        h[H] = instant_text(hold_at(lv))
        h[S] = instant_text(lv.ss, lv.sn)
    else
        h[H], h[S] = false, false
    end
end

function Pn.rl_pin(keys, a)
    local N = 'RL.PIN'
    local na = #a
    if #keys ~= 1 or na < 1 or na > 7 then arity(N) end
    -- A share key (or SHARES): see "Pins on share keys" below.
    local shares = is(a[1], 'SHARES')
    if shares or Pn.share_hash(keys[1]) then return Pn.rl_pin_share(keys[1], a, shares) end
    if na > 6 then arity(N) end
    local kind, Lp, from
    if is(a[1], 'BLOCK') then
        kind, from = 2, 2
    elseif is(a[1], 'EXEMPT') then
        kind, from = 3, 2
    else
        if na < 2 then arity(N) end
        Lp = limit_at(a, 1, N)
        kind, from = 1, 3
    end
    local ms = Pn.px(a, na, from, N)
    local key = keys[1]
    local ns, nn = now()
    local ut, us, un = '0', 0, 0
    if ms > 0 then
        us, un = add(ns, nn, floor(ms / 1000), (ms % 1000) * 1e6)
        if us > Pn.MAX_I64_S or (us == Pn.MAX_I64_S and un > Pn.MAX_I64_N) then
            fail('PX is too long')
        end
        ut = instant_text(us, un)
    end
    local h = read_leases(key, true)
    -- The bucket as it stands now without its old pin (pin.rs `pinned`).
    if h[P] then
        local old = Pn.parse_pin(h[P])
        if not Pn.pin_live(old, ns, nn) then
            Pn.end_pin(h, old, old.us, old.un)
        elseif old.absent then
            h[F] = false
        elseif old.k == 1 then
            -- Back under its base, at now: the new pin starts from there.
            local Pl = stored_texts(h[R], h[C])
            local B = old.B
            if B.r == Pl.r and B.c == Pl.c then B = Pl end
            local fs, fn = parse_instant(h[F])
            local hs, hn, ss, sn = Pn.hold_of(h)
            Pn.view_of(h, level_new(fs, fn, Pl, B, ns, nn, hs, hn, ss, sn))
        end
    end
    local pin = { none = ut == '0', us = us, un = un }
    if h[F] then
        if kind == 1 then
            local B = stored_texts(h[R], h[C])
            local T = Lp
            if B.r == Lp.r and B.c == Lp.c then T = B end
            local fs, fn = parse_instant(h[F])
            local hs, hn, ss, sn = Pn.hold_of(h)
            Pn.view_of(h, level_new(fs, fn, B, T, ns, nn, hs, hn, ss, sn))
            Pn.keep_pin(h, pin, Pn.pin_text(1, ut, false, B))
        else
            Pn.keep_pin(h, pin, Pn.pin_text(kind, ut, false))
        end
        Pn.write_view(key, h)
    elseif kind == 1 then
        -- Nothing underneath, and no caller's limit yet to say how full the bucket the key
        -- stands for is: the key holds only the pin (pin.rs `pinned`) until the first call,
        -- which starts it full under its own limit carried into the pin's (`level_pinned`).
        if h[P] then call('DEL', key) end
        Pn.keep_pin(h, pin, Pn.pin_text(1, ut, true, Lp))
        call('HSET', key, 'p', h.pw)
        expire(key, h, 0)
    else
        -- Nothing underneath: the key holds only the pin.
        if h[P] then call('DEL', key) end
        Pn.keep_pin(h, pin, Pn.pin_text(kind, ut, true))
        call('HSET', key, 'p', h.pw)
        expire(key, h, 0)
    end
    return { ok = 'OK' }
end

-- RL.UNPIN key -> 1 if a live pin was removed, else 0. A rate pin's tokens carry over into
-- the limit kept aside; a key left full with no lease (or that held only the pin) goes.
function Pn.rl_unpin(keys, a)
    if #keys ~= 1 or #a ~= 0 then arity('RL.UNPIN') end
    local key = keys[1]
    if Pn.share_hash(key) then return Pn.rl_unpin_share(key) end
    local ns, nn = now()
    local h = read_leases(key, true)
    if not h[P] then return 0 end
    local pin = Pn.parse_pin(h[P])
    if not Pn.pin_live(pin, ns, nn) then return 0 end
    Pn.end_pin(h, pin, ns, nn)
    local keep = false
    if h[F] then
        keep = h[I] or h[LS]
        local fs, fn = parse_instant(h[F])
        if lt(ns, nn, fs, fn) then keep = true end
        if h[H] and lt(ns, nn, parse_instant(h[H])) then keep = true end
    end
    if keep then
        Pn.write_view(key, h)
    else
        call('DEL', key)
    end
    return 1
end

-- RL.PINNED key -> nil, or the live pin: kind, rate and cap (a rate pin's; nil otherwise),
-- ms_left (-1: until RL.UNPIN).
function Pn.rl_pinned(keys, a)
    if #keys ~= 1 or #a ~= 0 then arity('RL.PINNED') end
    if Pn.share_hash(keys[1]) then return Pn.rl_pinned_share(keys[1]) end
    local ns, nn = now()
    local h = read_leases(keys[1], true)
    if not h[P] then return false end
    local pin = Pn.parse_pin(h[P])
    if not Pn.pin_live(pin, ns, nn) then return false end
    local rate, cap = false, false
    if pin.k == 1 then
        -- The pinned limit: the bucket's (r c), or a pin over nothing's own (in p).
        local Pl = pin.absent and pin.B or stored_texts(h[R], h[C])
        rate, cap = { double = Pl.r }, { double = Pl.c }
    end
    local left = -1
    if not pin.none then left = ceil_ms(sat_sub(pin.us, pin.un, ns, nn)) end
    return { map = { kind = Pn.KIND_NAME[pin.k], rate = rate, cap = cap, ms_left = left } }
end

-- ---------------------------------------------------------------------------------------
-- Rate shares (RL.SHARE, core/src/share.rs): a key divides its rate (and its cap, as
-- bursts) among holders that limit locally and call again every period.
--
-- A share is a hash (never a bucket, never the module's type: WRONGTYPE every way):
--   R, C  the limit's rate and cap texts (as the call that set it wrote them)
--   V     its version, decimal text (absent for 0)
--   <hex of the holder id>  one field per entry: "want rate burst lease_end held_rate
--         held_burst held_until", the four doubles as %.17g (read back exactly), the
--         instants as integer microseconds since the epoch (TIME's resolution: every
--         instant here is a whole µs, so µs compare as the module's ns do). The field
--         names are the ids in hex: their order as Lua compares strings is the ids' byte
--         order, the module's order (sums are taken in it, rounded as the module does).
--   P     a pin (RL.PIN on a share key, share.rs SharePin): "kind until" (2 BLOCK, 3
--         EXEMPT) or "1 until rt ct" (a rate pin and its limit's texts), until in µs (0:
--         at RL.UNPIN). A hash with P may hold no entry (a key pinned before any holder;
--         then R C are a placeholder the first call replaces). Absent: unpinned.
-- The key expires (PEXPIREAT) at ceil_ms of the latest entry end (max(lease_end,
-- held_until)), set on every write: when the last lease or hold ends; under a live pin
-- not before its end, and never (PERSIST) while a pin without an end holds.

local SHARE_HOLD_US = 250000
local SHARE_LEASE_PERIODS = 3
-- A shorter period_ms is raised to this (share.rs SHORTEST_PERIOD_MS): a holder calling
-- again after refresh_ms never calls within its previous call's hold.
local SHARE_SHORTEST_PERIOD = 300
local MAX_HOLDERS = 4096
local SHORT = 1e-9
-- share.rs shrank: down by more than rounding (the free rate is rounded down).
local function shrank(held, new) return held > new * (1 + SHORT) end
local SHARE_FAR = 0.9
local SHARE_ERR = {
    holder = 'holder must be 1 to 64 bytes',
    want = 'want must be a finite number from 0 to 1e15',
    period = 'period_ms must be an integer from 10 to 3600000',
    many = 'too many holders on this key (at most 4096)',
}

local function not_a_share(why)
    error({ reply = error_reply('WRONGTYPE the hash at this key is not a rate share of this '
        .. 'library (' .. why .. ')') }, 0)
end

local HEX -- byte -> two hex digits (built at the first call: no `string` at load)
local function hex(id)
    if not HEX then
        HEX = {}
        for b = 0, 255 do HEX[b] = fmt('%02x', b) end
    end
    local out = {}
    for k = 1, #id do out[k] = HEX[byte(id, k)] end
    return table.concat(out)
end


local function non_negative(x)
    if x > 0 then return x end
    return 0.0
end

-- Holder:commitment at instant t (µs): its share while t < lease_end, its old one while
-- t < held_until, the larger. `incl`: at t - 1 ns instead (t <= end, every end a whole µs).
local function rate_at(e, t, incl)
    local a, b = 0.0, 0.0
    if t < e.le or (incl and t == e.le) then a = e.r end
    if t < e.hu or (incl and t == e.hu) then b = e.hr end
    if b > a then return b end
    return a
end

local function burst_at(e, t, incl)
    local a, b = 0.0, 0.0
    if t < e.le or (incl and t == e.le) then a = e.b end
    if t < e.hu or (incl and t == e.hu) then b = e.hb end
    if b > a then return b end
    return a
end

local function entry_end(e)
    if e.hu > e.le then return e.hu end
    return e.le
end

-- water_level (share.rs) bit for bit: the same quickselect with the same pseudo-random
-- pivots (xorshift64, kept as two 32-bit halves: Lua has no 64-bit integers), the same
-- partial sums in the same order. `w` is reordered.
local TWO32 = 4294967296
local function u32(x) return x % TWO32 end
local function water_level(w, rate)
    local band, bor, bxor, lsh, rsh = bit.band, bit.bor, bit.bxor, bit.lshift, bit.rshift
    local lo, hi = 1, #w + 1 -- the part is w[lo .. hi - 1]
    local below, above = 0.0, 0
    local sh, sl = 0x9E3779B9, u32(bxor(0x7F4A7C15, #w))
    while lo < hi do
        -- seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17
        local nh = u32(bor(lsh(sh, 13), rsh(sl, 19)))
        local nl = u32(lsh(sl, 13))
        sh, sl = u32(bxor(sh, nh)), u32(bxor(sl, nl))
        nl = u32(bor(rsh(sl, 7), lsh(sh, 25)))
        nh = u32(rsh(sh, 7))
        sh, sl = u32(bxor(sh, nh)), u32(bxor(sl, nl))
        nh = u32(bor(lsh(sh, 17), rsh(sl, 15)))
        nl = u32(lsh(sl, 17))
        sh, sl = u32(bxor(sh, nh)), u32(bxor(sl, nl))
        local len = hi - lo
        local m = ((sh % len) * (TWO32 % len) + sl) % len
        local p = w[lo + m]
        -- partition3: [< p][== p][> p]
        local lt, i, gt = lo, lo, hi
        while i < gt do
            local x = w[i]
            if x < p then
                w[i], w[lt] = w[lt], x
                lt = lt + 1
                i = i + 1
            elseif x > p then
                gt = gt - 1
                w[i], w[gt] = w[gt], x
            else
                i = i + 1
            end
        end
        local s_lt = 0.0
        for k = lo, lt - 1 do s_lt = s_lt + w[k] end
        local c_ge = hi - lt
        if below + s_lt + p * (above + c_ge) >= rate then
            above = above + c_ge
            hi = lt
        else
            below = below + (s_lt + p * (gt - lt))
            lo = gt
        end
    end
    if above == 0 then return 1 / 0 end
    return non_negative((rate - below) / above)
end

-- The entries of a share hash (HGETALL's flat list), checked: anything this library does
-- not write is refused before anything is written. Returns the limit texts, version text,
-- and the entries sorted by field name (the ids' byte order), each {k, w, r, b, le, hr, hb,
-- hu} (k the field name, instants µs).
local function share_entries(all, key)
    local rt, ct, vt, pt, bad = nil, nil, nil, nil, nil
    local names, by, n = {}, {}, 0
    for j = 1, #all, 2 do
        local k, val = all[j], all[j + 1]
        if k == 'R' then rt = val
        elseif k == 'C' then ct = val
        elseif k == 'V' then vt = val
        elseif k == 'P' then pt = val
        elseif k == 'f' then
            error({ reply = error_reply('WRONGTYPE the hash at this key is a bucket of this '
                .. 'library, not a rate share') }, 0)
        elseif #k < 2 or #k > 128 or #k % 2 ~= 0 or sfind(k, '[^0-9a-f]') then
            bad = 'a field that is neither R, C, V nor a holder'
        else
            local w, r, b, le, hr, hb, hu = val:match(
                '^(%S+) (%S+) (%S+) (%d+) (%S+) (%S+) (%d+)$')
            -- (tonumber: these are %.17g texts this library wrote; any other number text
            -- must still be a finite number in range, NaN fails the range too)
            w, r, b, hr, hb = tonumber(w), tonumber(r), tonumber(b), tonumber(hr), tonumber(hb)
            le, hu = le and #le <= 16 and tonumber(le), hu and #hu <= 16 and tonumber(hu)
            if not (w and r and b and hr and hb and le and hu
                    and w >= 0 and w <= MAX_VALUE and r >= 0 and r <= MAX_VALUE
                    and b >= 0 and b <= MAX_VALUE and hr >= 0 and hr <= MAX_VALUE
                    and hb >= 0 and hb <= MAX_VALUE) then
                not_a_share('a holder entry that is not one')
            end
            n = n + 1
            names[n] = k
            by[k] = { k = k, w = w, r = r, b = b, le = le, hr = hr, hb = hb, hu = hu }
        end
    end
    if bad then not_a_share(bad) end
    if not (rt and ct) then not_a_share('no fields R, C') end
    local pin = pt and Pn.parse_share_pin(pt)
    if n == 0 and not pin then not_a_share('no holder') end
    local B = known_limit(rt, ct)
    if not B then
        local rate, cap = parse_number(rt), parse_number(ct)
        if not (rate and cap and in_range(rate) and in_range(cap) and cap / rate <= MAX_FILL_SECS) then
            not_a_share('its fields R, C are not a valid limit')
        end
        B = remember(make_limit(rate, cap, rt, ct))
    end
    if vt then
        local x = parse_integer(vt)
        if not x or x > MAX_VERSION then not_a_share('its field V is not a version') end
    end
    -- The names alone, with the built-in comparison (a Lua comparator costs several
    -- times more per comparison).
    table.sort(names)
    local list = {}
    for j = 1, n do list[j] = by[names[j]] end
    return B, vt, list, pin
end

-- A share hash's P (see above): {k, u (µs, 0: no end), ut (its text), L (a rate pin's
-- limit)}, or WRONGTYPE for anything this library does not write.
function Pn.parse_share_pin(t)
    local k, u, rest = t:match('^([123]) (%d+)(.*)$')
    if not k or #u > 16 then not_a_share('its field P is not a pin') end
    local pin = { k = tonumber(k), u = tonumber(u), ut = u }
    if pin.k == 1 then
        local rt, ct = rest:match('^ (%S+) (%S+)$')
        local rate, cap = rt and parse_number(rt), ct and parse_number(ct)
        if not (rate and cap and in_range(rate) and in_range(cap) and cap / rate <= MAX_FILL_SECS) then
            not_a_share('its field P is not a pin')
        end
        pin.L = make_limit(rate, cap, rt, ct)
    elseif rest ~= '' then
        not_a_share('its field P is not a pin')
    end
    return pin
end

function Pn.share_pin_live(pin, now_us) return pin.u == 0 or now_us < pin.u end

local function fmt_double(x) return fmt('%.17g', x) end

-- RL.SHARE key rate cap holder want period_ms [RELEASE] [VERSION v]
-- Reply [rate, burst, lease_ms, refresh_ms, holders].
local function rl_share(keys, a)
    local N = 'RL.SHARE'
    local na = #a
    if #keys ~= 1 or na < 5 then arity(N) end
    local L = limit_at(a, 1, N)
    local holder = a[3]
    if #holder < 1 or #holder > 64 then fail(SHARE_ERR.holder) end
    local want = number(a, 4, N, SHARE_ERR.want)
    local period = integer(a, 5, N, SHARE_ERR.period)
    local release, v, v_given = false, nil, false
    local i = 6
    while i <= na do
        local o = a[i]
        if is(o, 'VERSION') then
            once(v_given, o)
            v_given = true
            v = version_at(a, i + 1, N)
            i = i + 2
        elseif is(o, 'RELEASE') then
            once(release, o)
            release = true
            i = i + 1
        else
            unknown(o)
        end
    end
    if want == 0 then want = 0.0 end -- -0 is 0 (the stored form has no sign)
    if not (want >= 0 and want <= MAX_VALUE) then fail(SHARE_ERR.want) end
    if period < 10 or period > 3600000 then fail(SHARE_ERR.period) end
    if period < SHARE_SHORTEST_PERIOD then period = SHARE_SHORTEST_PERIOD end
    v = v or 0

    local key = keys[1]
    local _, _, now_us = now()
    local all = pcall_r('HGETALL', key)
    if all.err then
        if Ly.string_at(key) then
            return error_reply('WRONGTYPE the hash at this key is a bucket of this library, '
                .. 'not a rate share')
        end
        return all
    end
    local B, vt, list, pin = nil, nil, {}, nil
    local exists = #all > 0
    if exists then B, vt, list, pin = share_entries(all, key) end
    -- version.rs resolve: which limit decides, at which version (a key pinned before any
    -- holder: the call's, as for a new key).
    local D, dv = L, v
    if exists and #list > 0 then
        local sv = vt and tonumber(vt) or 0
        if v < sv then D, dv = B, sv
        elseif v == sv then
            dv = sv
            if B.r == L.r and B.c == L.c then D = B end
        end
    end
    -- A live pin decides (share.rs decide): a rate pin's limit is divided, D is kept.
    local live_pin = pin and Pn.share_pin_live(pin, now_us) and pin or nil
    local pk = live_pin and Pn.KIND_NAME[live_pin.k] or nil
    local rate, cap = D.r, D.c
    if live_pin and live_pin.k == 1 then rate, cap = live_pin.L.r, live_pin.L.c end
    local id = hex(holder)
    local own
    -- One pass over the others, in id order.
    local s_rate, s_burst, live, wants, dead, last_end = 0.0, 0.0, 0, 0.0, 0, 0
    local least_want = 1 / 0
    -- The sums as share.rs's Sum takes them: plain sums, the sizes of their additions'
    -- rounding errors, and how many terms (raised by their worst rounding if any rounded).
    local lost_rate, lost_burst, counted = 0.0, 0.0, 0
    for k = 1, #list do
        local e = list[k]
        if e.k == id then
            own = e
        elseif now_us >= entry_end(e) then
            dead = dead + 1
        else
            local en = entry_end(e)
            if en > last_end then last_end = en end
            local err
            s_rate, err = two_sum(s_rate, rate_at(e, now_us))
            lost_rate = lost_rate + math.abs(err)
            s_burst, err = two_sum(s_burst, burst_at(e, now_us))
            lost_burst = lost_burst + math.abs(err)
            counted = counted + 1
            if now_us < e.le then
                live = live + 1
                wants = wants + e.w
                if e.w < least_want then least_want = e.w end
            end
        end
    end
    if lost_rate ~= 0 then s_rate = mul_up(s_rate, 1 + counted * 2 ^ -52) end
    if lost_burst ~= 0 then s_burst = mul_up(s_burst, 1 + counted * 2 ^ -52) end
    local others = #list - dead - (own and 1 or 0)
    local own_alive = own and now_us < entry_end(own) and own or nil
    if live_pin and live_pin.k ~= 1 and not release then
        -- share.rs gated: BLOCK a zero share, EXEMPT the callers' limit for no longer than
        -- the pin; nothing written; called again in a period or at the pin's end.
        local holders = live + ((own and now_us < own.le) and 1 or 0)
        local refresh, lease = period, period * SHARE_LEASE_PERIODS
        if live_pin.u ~= 0 then
            local left = live_pin.u - now_us
            refresh = math.max(1, math.min(period, ceil(left / 1000)))
            lease = math.min(lease, floor(left / 1000))
        end
        if live_pin.k == 2 then
            return { { double = 0.0 }, { double = 0.0 }, 0, refresh, holders, pk }
        end
        return { { double = D.r }, { double = D.c }, lease, refresh, holders, pk }
    end
    if release and not (own and now_us < own.le) then
        return Pn.pinned_reply({ { double = 0.0 }, { double = 0.0 }, 0, period, live }, pk)
    end
    -- A holder whose last call shrank its share, calling again within that call's hold
    -- (share.rs shrank_within_hold): answered from its entry, nothing written, so that
    -- calling sooner than told never keeps its larger old share counted past the hold.
    if not release and own and now_us < own.le and now_us < own.hu
            and (shrank(own.hr, own.r) or shrank(own.hb, own.b)) then
        local refresh = ceil((own.hu - now_us) / 1000)
        if refresh < 10 then refresh = 10 end
        return Pn.pinned_reply({ { double = own.r }, { double = own.b },
            floor((own.le - now_us) / 1000), refresh, live + 1 }, pk)
    end
    if not own_alive and others >= MAX_HOLDERS then fail(SHARE_ERR.many) end

    local srate, sburst, short, far, capped = 0.0, 0.0, false, false, false
    if not release then
        -- target (share.rs): in proportion to the wants when they fit, else max-min fair.
        local n = live + 1
        local sum = wants + want
        local target
        if sum <= rate then
            if sum == 0 then target = rate / n else target = rate * (want / sum) end
        elseif want <= rate / n then
            target = want
        else
            local w = {}
            for k = 1, #list do
                local e = list[k]
                if e ~= own and now_us < e.le then w[#w + 1] = e.w end
            end
            w[#w + 1] = want
            local level = water_level(w, rate)
            target = want
            if level < target then target = level end
        end
        local target_burst = target * cap / rate
        local free = sub_down(rate, s_rate)
        local free_burst = sub_down(cap, s_burst)
        srate = non_negative(math.min(target, free))
        sburst = non_negative(math.min(target_burst, free_burst))
        short = srate < target * (1.0 - SHORT) or sburst < target_burst * (1.0 - SHORT)
        -- Far short (share.rs FAR): below nine tenths of its target.
        far = srate < target * SHARE_FAR or sburst < target_burst * SHARE_FAR
        -- Capped (share.rs): cut below its want, and some other live holder wants less
        -- than it gets.
        capped = target < want * (1.0 - SHORT) and least_want < target
    end
    local lease_us = period * SHARE_LEASE_PERIODS * 1000
    local entry = {
        k = id, w = want, r = srate, b = sburst,
        le = release and now_us or now_us + lease_us,
        hr = own_alive and rate_at(own_alive, now_us) or 0.0,
        hb = own_alive and burst_at(own_alive, now_us) or 0.0,
        hu = now_us + SHARE_HOLD_US,
    }
    local refresh = period
    if short then
        -- next_release: the earliest instant after now at which another entry frees
        -- something (its commitment drops).
        local nx
        for k = 1, #list do
            local e = list[k]
            if e ~= own then
                for _, t in ipairs({ e.le, e.hu }) do
                    if t > now_us and (rate_at(e, t, true) > rate_at(e, t)
                            or burst_at(e, t, true) > burst_at(e, t)) then
                        if not nx or t < nx then nx = t end
                    end
                end
            end
        end
        -- Not within this call's hold if it holds more than the new share.
        local soonest = 10
        if shrank(entry.hr, srate) or shrank(entry.hb, sburst) then soonest = SHARE_SHORTEST_PERIOD end
        -- Far short: back within a quarter period even when nothing frees before.
        local latest = period
        if far then latest = math.max(floor(period / 4), soonest) end
        if nx then
            refresh = ceil((nx - now_us) / 1000)
            if refresh < soonest then refresh = soonest
            elseif refresh > latest then refresh = latest end
        else
            refresh = math.max(floor(period / 4), soonest)
        end
    elseif capped then
        -- At its target but wanting more: half a period, not within its hold if it shrank.
        local soonest = 10
        if shrank(entry.hr, srate) or shrank(entry.hb, sburst) then soonest = SHARE_SHORTEST_PERIOD end
        refresh = math.max(floor(period / 2), soonest)
    elseif not (own and now_us < own.le) then
        -- A newcomer comes back after the shortest period with what it measured.
        refresh = math.min(period, SHARE_SHORTEST_PERIOD)
    end
    local expires = last_end
    if entry_end(entry) > expires then expires = entry_end(entry) end

    -- Write: the entry, the limit and version if they changed, the dead entries dropped,
    -- the expiry.
    local args = { key, id, fmt('%s %s %s %d %s %s %d', fmt_double(entry.w), fmt_double(entry.r),
        fmt_double(entry.b), entry.le, fmt_double(entry.hr), fmt_double(entry.hb), entry.hu) }
    if not exists or D ~= B then
        args[#args + 1] = 'R'; args[#args + 1] = D.rt
        args[#args + 1] = 'C'; args[#args + 1] = D.ct
    end
    if dv ~= 0 and (not vt or tonumber(vt) ~= dv) then
        args[#args + 1] = 'V'; args[#args + 1] = fmt('%d', dv)
    end
    call('HSET', unpack(args))
    -- A key pinned before any holder takes the call's version, 0 included; an ended pin
    -- goes at the write.
    if dv == 0 and vt then call('HDEL', key, 'V') end
    if pin and not live_pin then call('HDEL', key, 'P') end
    if dead > 0 then
        local drop = { key }
        for k = 1, #list do
            local e = list[k]
            if e ~= own and now_us >= entry_end(e) then drop[#drop + 1] = e.k end
        end
        call('HDEL', unpack(drop))
    end
    Pn.share_expire(key, live_pin, expires)
    local lease_ms = 0
    if not release then lease_ms = period * SHARE_LEASE_PERIODS end
    local holders = live
    if not release then holders = holders + 1 end
    return Pn.pinned_reply({ { double = srate }, { double = sburst }, lease_ms, refresh, holders },
        pk)
end

-- A reply with the pin's kind appended when a live pin decided (share.rs `pinned`).
function Pn.pinned_reply(r, pk)
    if pk then r[6] = pk end
    return r
end

-- The key's expiry (share.rs keep_until): its last entry's end `last_us`, not before a live
-- pin's end, never while a pin without an end holds.
function Pn.share_expire(key, pin, last_us)
    if pin and pin.u == 0 then
        call('PERSIST', key)
        return
    end
    if pin and pin.u > last_us then last_us = pin.u end
    call('PEXPIREAT', key, ms_arg(ceil(last_us / 1000)))
end

-- ---------------------------------------------------------------------------------------
-- Pins on share keys (src/share/pin.rs): RL.PIN key [SHARES] rate cap|BLOCK|EXEMPT [PX ms],
-- RL.UNPIN, RL.PINNED. Setting or removing a pin drops the entries dead then and changes
-- nothing else.

-- Whether the hash at key is a share (it has R); false for anything else, errors included.
function Pn.share_hash(key)
    local r = pcall_r('HEXISTS', key, 'R')
    return r == 1
end

local NOT_SHARES = 'this key is not a share key: RL.PIN key SHARES ... pins share keys '
    .. '(RL.SHARE) or a key that holds nothing'
local SHARE_KEY = 'this key holds shares (RL.SHARE): pin it with RL.PIN key rate '
    .. 'cap|BLOCK|EXEMPT [PX ms]'

-- The entries of the share at key dead at now_us dropped (HDEL); returns the list left (or
-- nil for no key), its last end, and the table's parts.
function Pn.share_pruned(key, now_us)
    local all = pcall_r('HGETALL', key)
    if all.err then error({ reply = all }, 0) end
    if #all == 0 then return nil end
    local B, vt, list, pin = share_entries(all, key)
    local drop, left, last = { key }, {}, 0
    for k = 1, #list do
        local e = list[k]
        if now_us >= entry_end(e) then
            drop[#drop + 1] = e.k
        else
            left[#left + 1] = e
            if entry_end(e) > last then last = entry_end(e) end
        end
    end
    if #drop > 1 then call('HDEL', unpack(drop)) end
    return left, last, pin
end

function Pn.rl_pin_share(key, a, shares)
    local N = 'RL.PIN'
    local na = #a
    if shares then
        local t = pcall_r('TYPE', key)
        t = type(t) == 'table' and t.ok or t
        if t ~= 'none' and not Pn.share_hash(key) then
            if t ~= 'hash' and not (t == 'string' and Ly.string_at(key)) then
                error({ reply = error_reply('WRONGTYPE Operation against a key holding the '
                    .. 'wrong kind of value') }, 0)
            end
            fail(NOT_SHARES)
        end
    end
    local at = shares and 2 or 1
    if a[at] and (is(a[at], 'PERMITS') or is(a[at], 'SHARES')) then fail(SHARE_KEY) end
    local kind, Lp, from
    if a[at] and is(a[at], 'BLOCK') then
        kind, from = 2, at + 1
    elseif a[at] and is(a[at], 'EXEMPT') then
        kind, from = 3, at + 1
    else
        if na < at + 1 then arity(N) end
        Lp = limit_at(a, at, N)
        kind, from = 1, at + 2
    end
    local ms = Pn.px(a, na, from, N)
    local _, _, now_us = now()
    local u = 0
    if ms > 0 then
        -- The module's end in ns must fit an i64.
        if ms > (9223372036854775 - now_us) / 1000 then fail('PX is too long') end
        u = now_us + ms * 1000
    end
    local text = fmt('%d %d', kind, u)
    if Lp then text = text .. ' ' .. Lp.rt .. ' ' .. Lp.ct end
    local list, last = Pn.share_pruned(key, now_us)
    if list then
        call('HSET', key, 'P', text)
    else
        -- The pin alone, with a placeholder limit (a rate pin's own, else 1 1).
        local rt, ct = '1', '1'
        if Lp then rt, ct = Lp.rt, Lp.ct end
        call('HSET', key, 'R', rt, 'C', ct, 'P', text)
        last = 0
    end
    Pn.share_expire(key, { u = u }, last)
    return { ok = 'OK' }
end

function Pn.rl_unpin_share(key)
    local _, _, now_us = now()
    local all = pcall_r('HGET', key, 'P')
    if not all or type(all) == 'table' then return 0 end
    local pin = Pn.parse_share_pin(all)
    if not Pn.share_pin_live(pin, now_us) then return 0 end
    local list, last = Pn.share_pruned(key, now_us)
    if #list == 0 then
        call('DEL', key)
    else
        call('HDEL', key, 'P')
        Pn.share_expire(key, nil, last)
    end
    return 1
end

function Pn.rl_pinned_share(key)
    local _, _, now_us = now()
    local t = pcall_r('HGET', key, 'P')
    if not t or type(t) == 'table' then return false end
    local pin = Pn.parse_share_pin(t)
    if not Pn.share_pin_live(pin, now_us) then return false end
    local rate, cap = false, false
    if pin.L then rate, cap = { double = pin.L.r }, { double = pin.L.c } end
    local left = -1
    if pin.u ~= 0 then left = ceil((pin.u - now_us) / 1000) end
    return { map = { kind = Pn.KIND_NAME[pin.k], rate = rate, cap = cap, ms_left = left } }
end

-- ---------------------------------------------------------------------------------------
-- The boundary: argument and state errors become the module's error replies.

-- `quick` (optional): the command's common case, which raises nothing; nil when the call
-- is not that case.
local function boundary(f, quick)
    return function(keys, args)
        if not call then bind() end
        local ok, res = true, nil
        if quick then
            -- Inside the pcall too: a stored hash that is not a bucket raises (stored_texts).
            ok, res = pcall(quick, keys, args)
        end
        if ok and res == nil then ok, res = pcall(f, keys, args) end
        if ok then return res end
        if type(res) == 'table' then
            if res.rl then return error_reply('ERR ' .. res.rl) end
            if res.reply then return res.reply end
        end
        -- A server call refused inside (`redis.call`: no permission for a command, OOM),
        -- caught by the pcall as its text, code first (`ERR The user executing the script
        -- can't run this command...`): answered as that error. Raised again, the server
        -- would put its own `ERR ` before it (`ERR ERR ...`).
        if type(res) == 'string' and sfind(res, '^%u+ ') then return error_reply(res) end
        error(res, 0)
    end
end

-- Pinning is an operator's act (the module's RL.PIN and RL.UNPIN are `@admin`). A function
-- has no ACL category on any server and ACL rules cannot name one (`+fcall` allows every
-- function of every library), so the library holds rl_pin and rl_unpin to the rule the
-- module's setters follow: the caller's user must be allowed `CONFIG SET`. Only a client's
-- call is checked: replicas and the AOF receive the writes a call made, not the call.
-- (rl_pinned only reads: open to every caller.)
local function operator(f, name)
    local refused = 'NOPERM ' .. name .. ' is an operator\'s command: only a user allowed '
        .. 'to run CONFIG SET may call it (ACL rules cannot name a function)'
    return function(keys, args)
        if not redis.acl_check_cmd('CONFIG', 'SET', 'maxmemory', '0') then
            return redis.error_reply(refused)
        end
        return f(keys, args)
    end
end

redis.register_function('rl_take', boundary(rl_take, quick_take))
redis.register_function('rl_lease', boundary(rl_lease))
redis.register_function('rl_return', boundary(rl_return))
redis.register_function('rl_mtake', boundary(rl_mtake))
redis.register_function('rl_budget', boundary(Bg.rl_budget))
redis.register_function('rl_settle', boundary(Bg.rl_settle))
redis.register_function('rl_reserve', boundary(rl_reserve))
redis.register_function('rl_refund', boundary(rl_refund))
redis.register_function('rl_share', boundary(rl_share))
redis.register_function('rl_pin', operator(boundary(Pn.rl_pin), 'rl_pin'))
redis.register_function('rl_unpin', operator(boundary(Pn.rl_unpin), 'rl_unpin'))
redis.register_function {
    function_name = 'rl_pinned',
    callback = boundary(Pn.rl_pinned),
    flags = { 'no-writes' },
}
redis.register_function {
    function_name = 'rl_peek',
    callback = boundary(rl_peek),
    flags = { 'no-writes' },
}
