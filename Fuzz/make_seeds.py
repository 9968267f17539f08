#!/usr/bin/env python3
"""Writes the seed corpus of fuzz-request (Fuzz/corpus/request/). Re-run after editing; the
file names are the seed names. Format (Sources/fuzz-request/Harness.swift): byte 0 picks the
application (T: --token fuzz-token, O: no token), then raw HTTP requests separated by `###` lines;
@ID@, @ID2@ and @LEASE@ are replaced by the newest operation ids and lease token."""
import os, sys

AUTH = "Authorization: Bearer fuzz-token\r\n"
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "request")

def req(method, target, body=None, headers=(), auth=False):
    s = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\n"
    if auth:
        s += AUTH
    for h in headers:
        s += h + "\r\n"
    b = b""
    if body is not None:
        b = body if isinstance(body, bytes) else body.encode()
        s += "Content-Type: application/json\r\n" + f"Content-Length: {len(b)}\r\n"
    return s.encode("latin-1") + b"\r\n" + b

def seed(name, app, *reqs):
    data = app.encode() + b"\n###\n".join(reqs)
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)

Q = '{"name":"q1","maxConcurrentOperationCount":2}'
mkq = lambda auth=False: req("POST", "/v1/queues", Q, auth=auth)
op = lambda body, auth=False, q="q1": req("POST", f"/v1/queues/{q}/operations", body, auth=auth)

seeds = {
 # service
 "healthz": ("O", [req("GET", "/healthz")]),
 "readyz-token-none": ("T", [req("GET", "/readyz")]),
 "metrics": ("T", [req("GET", "/metrics", auth=True)]),
 "metrics-no-token": ("T", [req("GET", "/metrics")]),
 "openapi-head": ("O", [req("HEAD", "/openapi.yaml")]),
 # queues
 "queue-create": ("O", [mkq()]),
 "queue-create-token": ("T", [mkq(True), req("GET", "/v1/queues", auth=True)]),
 "queue-create-wrong-token": ("T", [req("POST", "/v1/queues", Q, headers=["Authorization: Bearer nope"])]),
 "queue-get-etag": ("O", [mkq(), req("GET", "/v1/queues/q1"), req("GET", "/v1/queues/q1", headers=['If-None-Match: W/"x", *'])]),
 "queue-patch": ("O", [mkq(), req("PATCH", "/v1/queues/q1", '{"maxConcurrentOperationCount":-1,"isSuspended":true}')]),
 "queue-actions": ("O", [mkq(), req("POST", "/v1/queues/q1/suspend"), req("POST", "/v1/queues/q1/resume", "{}"),
                         req("POST", "/v1/queues/q1/cancel-all"), req("POST", "/v1/queues/q1/barrier", '{"name":"b"}')]),
 "queue-wait-delete": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":0.01}}'), req("GET", "/v1/queues/q1/wait?timeout=1"),
                             req("DELETE", "/v1/queues/q1?force=true")]),
 "queue-list-ops": ("O", [mkq(), op('{"kind":"external"}'), req("GET", "/v1/queues/q1/operations?state=ready&limit=1&after=@ID@")]),
 "queue-idempotency": ("O", [req("POST", "/v1/queues", '{"name":"idem"}', headers=["Idempotency-Key: k1"]),
                             req("POST", "/v1/queues", '{"name":"idem"}', headers=["Idempotency-Key: k1"]),
                             req("POST", "/v1/queues", '{"name":"other"}', headers=["Idempotency-Key: k1"])]),
 # operations, every kind
 "op-delay": ("O", [mkq(), op('{"kind":"delay","name":"d","queuePriority":"veryHigh","spec":{"seconds":5},"timeout":30,"retry":{"maxAttempts":3,"backoff":1.0,"multiplier":2.0},"notBefore":"2026-11-22T10:00:00Z"}')]),
 "op-http": ("O", [mkq(), op('{"kind":"http","spec":{"method":"POST","url":"http://127.0.0.1:9/x","headers":{"X-A":"b"},"body":{"a":1},"expectStatus":[200,"4xx"],"timeout":0.5}}')]),
 "op-command": ("O", [mkq(), op('{"kind":"command","spec":{"argv":["/bin/true"],"env":{"A":"b"},"cwd":"/"}}')]),
 "op-external": ("T", [mkq(True), op('{"kind":"external","spec":{"lease":30}}', True)]),
 "op-deps": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":1}}'), op('{"kind":"delay","spec":{"seconds":1},"dependencies":["@ID@"]}'),
                   req("PATCH", "/v1/operations/@ID2@", '{"dependencies":["@ID@"]}')]),
 "op-cancel-cascade": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":60}}'), op('{"kind":"delay","spec":{"seconds":1},"dependencies":["@ID@"]}'),
                             req("POST", "/v1/operations/@ID2@/cancel?cascade=true")]),
 "op-pause-resume-patch": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":3}}'), req("POST", "/v1/operations/@ID@/pause"),
                                 req("PATCH", "/v1/operations/@ID@", '{"queuePriority":"low"}'), req("POST", "/v1/operations/@ID@/resume"),
                                 req("GET", "/v1/operations/@ID@", headers=['If-None-Match: "r1"'])]),
 "op-events-observers": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":2}}'), req("GET", "/v1/operations/@ID@/events"),
                               req("POST", "/v1/operations/@ID@/observers", '{"url":"http://127.0.0.1:9/hook","keys":["isFinished","progress"]}'),
                               req("GET", "/v1/operations/@ID@/observers"), req("GET", "/v1/operations/@ID@/observers/wh-1"),
                               req("DELETE", "/v1/operations/@ID@/observers/wh-1")]),
 "op-wait": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":0}}'), req("GET", "/v1/operations/@ID@/wait?timeout=0.5")]),
 # workers
 "worker-flow": ("O", [mkq(), op('{"kind":"external","spec":{"lease":5}}'), req("POST", "/v1/queues/q1/claim?wait=1", '{"worker":"w1"}'),
                       req("POST", "/v1/operations/@ID@/heartbeat", '{"leaseToken":"@LEASE@"}'),
                       req("POST", "/v1/operations/@ID@/progress", '{"leaseToken":"@LEASE@","completed":3,"total":10}'),
                       req("GET", "/v1/workers"),
                       req("POST", "/v1/operations/@ID@/finish", '{"leaseToken":"@LEASE@","result":{"ok":true}}')]),
 "worker-fail": ("T", [mkq(True), op('{"kind":"external"}', True), req("POST", "/v1/queues/q1/claim", "", auth=True),
                       req("POST", "/v1/operations/@ID@/finish", '{"leaseToken":"@LEASE@","error":{"type":"boom","detail":"x","data":[1]}}', auth=True)]),
 # events
 "events-feed": ("O", [mkq(), req("GET", "/v1/events?after=0&limit=10&wait=1")]),
 "events-stream": ("O", [mkq(), req("GET", "/v1/events/stream?after=0"), op('{"kind":"delay","spec":{"seconds":0}}')]),
 "events-stream-last-event-id": ("T", [req("GET", "/v1/events/stream", headers=["Last-Event-ID: 3", AUTH.strip()])]),
 # known nasty ones
 "nasty-last-event-id-max": ("O", [req("GET", "/v1/events/stream", headers=["Last-Event-ID: 18446744073709551615"])]),
 "nasty-expect-status-combining": ("O", [req("POST", "/v1/queues/any/operations",
     '{"kind":"http","spec":{"method":"GET","url":"http://127.0.0.1:9/","expectStatus":["1\\u0301xx"]}}')]),
 "nasty-relative-target": ("O", [req("POST", "x/v1/queues", Q)]),
 "nasty-star-target": ("T", [req("OPTIONS", "*"), req("GET", "http://h/v1/queues", auth=True)]),
 "nasty-huge-numbers": ("O", [req("POST", "/v1/queues", '{"name":"n","maxConcurrentOperationCount":1e308}'),
     op('{"kind":"delay","spec":{"seconds":-0},"timeout":18446744073709551616,"retry":{"maxAttempts":1e308,"backoff":-0,"multiplier":18446744073709551616}}', q="n"),
     req("PATCH", "/v1/queues/n", '{"maxConcurrentOperationCount":-0}'),
     req("GET", "/v1/events?after=18446744073709551616&limit=1e308&wait=-0"),
     req("GET", "/v1/queues/n/operations?limit=18446744073709551616&after=op-ffffffffffffffff")]),
 "nasty-huge-progress": ("O", [mkq(), op('{"kind":"external"}'), req("POST", "/v1/queues/q1/claim"),
     req("POST", "/v1/operations/@ID@/progress", '{"leaseToken":"@LEASE@","completed":1e308,"total":-0}')]),
 "nasty-deep-json": ("O", [req("POST", "/v1/queues/q1/operations", '{"kind":"external","spec":' + "[" * 70 + "]" * 70 + "}")]),
 "nasty-deep-result": ("O", [mkq(), op('{"kind":"external"}'), req("POST", "/v1/queues/q1/claim"),
     req("POST", "/v1/operations/@ID@/finish", '{"leaseToken":"@LEASE@","result":' + '{"a":' * 62 + "1" + "}" * 62 + "}")]),
 "nasty-invalid-utf8": ("O", [req("POST", "/v1/queues", b'{"name":"\xff\xfe\xc3"}'),
                              req("GET", "/v1/queues/%ff%fe?\xff=\xfe"), req("GET", "/v1/queues/\xc3\x28\x00tail")]),
 "nasty-query-escapes": ("O", [req("GET", "/v1/events?after=%31&limit=+1&wait=%00&&=")]),
 "nasty-chunked": ("O", [b"POST /v1/queues HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"nam\r\n9;x=y\r\ne\":\"c1\"}\r\n0\r\n\r\n"]),
 "nasty-big-content-length": ("O", [b"POST /v1/queues HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n{}"]),
 "nasty-folded-headers": ("T", [b"GET /v1/queues HTTP/1.1\r\nAuthorization: Bearer\r\n fuzz-token\r\nX: a\r\nx: b\r\n\r\n"]),
 "nasty-batch-and-copy": ("O", [mkq(), req("POST", "/v1/operations:batch", '{"operations":[{"ref":"a","queue":"q1","kind":"delay","spec":{"seconds":1}}]}'),
     op('{"kind":"delay","spec":{"seconds":1}}'), req("POST", "/v1/operations/@ID@/copy", '{"queue":"q1"}'),
     req("GET", "/v1/queues/q1/archive"), req("POST", "/v1/queues/q1/operations:cancel", '{"kind":"delay"}')]),
 "nasty-numbers-and-dates": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":1},"notBefore":"2026-02-30T00:00:00Z"}'),
     op('{"kind":"delay","spec":{"seconds":1},"notBefore":"2028-02-29T23:59:59.999999999-23:59"}'),
     req("POST", "/v1/operations/@ID@/copy", '{"notBefore":"2261-12-31T23:59:60+00:00"}'),
     req("GET", "/v1/events?after=0x10&limit=%2B5&wait=0x1p4"), req("GET", "/v1/events?wait=300.00000000000000001&limit=010"),
     req("GET", "/v1/queues/q1/wait?timeout=inf"), req("GET", "/v1/operations/@ID@/wait?timeout=1e-3"),
     b"GET /v1/events/stream HTTP/1.1\r\nLast-Event-ID: -0\r\n\r\n", req("POST", "/v1/queues/q1/claim?wait=nan&max=1.0")]),
 "nasty-archive": ("O", [mkq(), op('{"kind":"delay","spec":{"seconds":1},"name":"a"}'),
     op('{"kind":"delay","spec":{"seconds":1},"dependencies":["@ID@"],"queuePriority":"high"}'), req("POST", "/v1/operations/@ID@/pause"),
     req("GET", "/v1/queues/q1/archive"),
     req("POST", "/v1/queues/q2/archive", '{"format":"opqd-archive/1","queue":{"maxConcurrentOperationCount":1,"isSuspended":true},'
         '"operations":[{"id":"x","kind":"delay","spec":{"seconds":1},"dependencies":["y","@ID@"],"isPaused":true,"attempt":2},'
         '{"id":"y","kind":"barrier","name":"b"}]}'),
     req("POST", "/v1/queues/q3/archive", '{"format":"opqd-archive/1","queue":{},"operations":[{"id":"x","kind":"delay","spec":{"seconds":1e309},'
         '"dependencies":["x"],"attempt":1e300}]}')]),
}
os.makedirs(out, exist_ok=True)
for name, (app, reqs) in seeds.items():
    seed(name, app, *reqs)
print(f"{len(seeds)} seeds in {out}")
