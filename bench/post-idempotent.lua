-- wrk: the create of post.lua, each with an Idempotency-Key of its own (never repeated), so the
-- measure is the keyed create path: the key's check, the change and its kept answer committed
-- in one transaction, and the answer kept in the cache.
wrk.method = "POST"
wrk.body = '{"kind":"delay","spec":{"seconds":1},"queuePriority":"high"}'
wrk.headers["Content-Type"] = "application/json"
local counter = 0
local prefix = tostring(math.random(1, 1e9)) .. "-"
function setup(thread)
    thread:set("id", tostring(math.random(1, 1e9)))
end
function init(args)
    prefix = prefix .. (id or "0") .. "-"
end
function request()
    counter = counter + 1
    wrk.headers["Idempotency-Key"] = prefix .. counter
    return wrk.format()
end
