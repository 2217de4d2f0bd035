-- redis-rl's counters for prometheus-redis-exporter's `--script` option (the exporter
-- reads only the sections of `INFO ALL`, which leaves module sections out). Returns
-- name/value pairs; the exporter publishes each as
--   redis_script_values{key="<name>"} <value>
-- Global counters keep their INFO names (`rl_calls`, `rl_denied`, ...); per-namespace
-- ones are named `rl_ns_<field>;<namespace>` (`rl_ns_denied;orders`), so PromQL can split
-- the namespace out with label_replace.
local out = {}
local info = redis.call('INFO', 'rl')
for line in string.gmatch(info, '[^\r\n]+') do
    local name, value = string.match(line, '^(rl_[%w_]+):(%d+)$')
    if name then
        out[#out + 1] = name
        out[#out + 1] = value
    else
        local ns, fields = string.match(line, '^rl_ns_([^:]*):(.*)$')
        if ns then
            for field, v in string.gmatch(fields, '([%w_]+)=(%d+)') do
                out[#out + 1] = 'rl_ns_' .. field .. ';' .. ns
                out[#out + 1] = v
            end
        end
    end
end
return out
