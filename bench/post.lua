-- wrk: POST creating a delay operation in a suspended queue (nothing runs, so the
-- measure is the create path: parse, validate, engine add, commit with the SQLite store, encode).
wrk.method = "POST"
wrk.body = '{"kind":"delay","spec":{"seconds":1},"queuePriority":"high"}'
wrk.headers["Content-Type"] = "application/json"
