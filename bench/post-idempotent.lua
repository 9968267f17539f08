-- wrk: the create of post.lua, each with an Idempotency-Key of its own (never repeated), so the
-- measure is the keyed create path: the key's check, the change and its kept answer committed
-- in one transaction, and the answer kept in the cache.
wrk.method = "POST"
wrk.body = '{"kind":"delay","spec":{"seconds":1},"queuePriority":"high"}'
wrk.headers["Content-Type"] = "application/json"
-- Keys never repeat, across threads and across runs against one server: the run's start
-- (seconds and CPU clock) and the thread's number prefix a per-thread counter.
local counter = 0
local prefix = ""
local threads = 0
local run = tostring(os.time()) .. "." .. tostring(math.floor(os.clock() * 1e6))
function setup(thread)
    threads = threads + 1
    thread:set("id", run .. "-" .. threads)
end
function init(args)
    prefix = (id or run) .. "-"
end
function request()
    counter = counter + 1
    wrk.headers["Idempotency-Key"] = prefix .. counter
    return wrk.format()
end
