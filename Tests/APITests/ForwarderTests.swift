import Dispatch
import Foundation
import Locking
import MicroHTTP
import OutboundHTTP
import QueueTesting
import Testing

@testable import QueueAPI
@testable import QueueCluster

#if canImport(Glibc)
import Glibc
#endif

/// The owner of the tests below: a MicroHTTP server that echoes what it received as JSON, or
/// answers what a test path asks for.
private func ownerHandler(_ req: HTTPRequest) -> HTTPHandlerResult {
    func echo() -> HTTPResponse {
        let object: [String: Any] = [
            "method": req.method, "path": req.path, "query": req.query, "headers": req.headers,
            "body": Data(req.body).base64EncodedString(),
        ]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return HTTPResponse(status: 200, headers: [("Content-Type", "application/json"), ("X-Owner", "yes")], body: Array(data))
    }
    switch req.path {
    case "/created":
        return .response(
            HTTPResponse(status: 201, headers: [("Location", "/v1/operations/42"), ("Content-Type", "application/json")], body: Array(#"{"id":"42"}"#.utf8)))
    case "/not-modified":
        return .response(HTTPResponse(status: 304, headers: [("ETag", "\"v7\"")]))
    case "/conflict":
        return .response(Problem(409, "queue-exists", "Queue exists", "a queue named 'q' already exists").response)
    case "/moved":
        return .response(HTTPResponse(status: 302, headers: [("Location", "/echo")], body: Array("see /echo".utf8)))
    case "/binary":
        return .response(HTTPResponse(status: 200, headers: [("Content-Type", "application/octet-stream")], body: ForwarderTests.binary))
    case "/huge":
        return .response(HTTPResponse(status: 200, body: [UInt8](repeating: 7, count: 3 << 20)))
    case "/hold":
        // Holds until its client (the forwarder's connection) is gone, then says when.
        return .deferred { responder in
            @Sendable func look() {
                DispatchQueue.global().asyncAfter(deadline: .now() + 0.05) {
                    if responder.isClientGone {
                        ForwarderTests.ownerSawClientGone.withLock { $0 = Date() }
                        responder.respond(HTTPResponse(status: 204))
                    } else {
                        look()
                    }
                }
            }
            look()
        }
    case "/slow":
        let request = req
        return .deferred { responder in
            DispatchQueue.global().asyncAfter(deadline: .now() + 1.5) {
                responder.respond(HTTPResponse(status: 200, headers: [("Content-Type", "text/plain")], body: Array("late \(request.query["wait"] ?? "")".utf8)))
            }
        }
    default:
        return .response(echo())
    }
}

/// An owner server, a forwarder and a forwarding server in front of it; both shut down on every path.
private func withPair<T>(
    maxResponseBytes: Int = 2 << 20, ownerBase: String? = nil,
    _ body: (_ owner: HTTPServer, _ front: HTTPServer, _ forwarder: Forwarder) throws -> T
) throws -> T {
    let owner = HTTPServer(configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2, maxBodyBytes: 4 << 20), handler: ownerHandler)
    try owner.start()
    defer { owner.shutdown(timeout: .seconds(2)) }
    return try withFront(to: ownerBase ?? "http://127.0.0.1:\(owner.port)", maxResponseBytes: maxResponseBytes) { front, forwarder in
        try body(owner, front, forwarder)
    }
}

/// A front server whose forwarder relays everything to `base`.
private func withFront<T>(
    to base: String, maxResponseBytes: Int = 2 << 20, requestTimeout: Double = Forwarder.defaultRequestTimeout,
    _ body: (_ front: HTTPServer, _ forwarder: Forwarder) throws -> T
) throws -> T {
    let forwarder = Forwarder(selfID: "instance-a", maxResponseBytes: maxResponseBytes, maxWaitSeconds: 300, requestTimeout: requestTimeout)
    let front = HTTPServer(
        configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2, maxBodyBytes: 4 << 20),
        handler: { req in forwarder.forward(req, to: base) })
    try front.start()
    defer { front.shutdown(timeout: .seconds(2)) }
    return try body(front, forwarder)
}

/// One request on a fresh connection.
private func send(
    _ port: Int, _ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil
) throws -> TestResponse {
    let connection = try RawConnection(port: port, timeout: 20)
    defer { connection.close() }
    return try connection.request(method, target, headers: headers, body: body)
}

/// A GET on a fresh connection.
private func send(_ port: Int, _ target: String, headers: [(String, String)] = []) throws -> TestResponse {
    try send(port, "GET", target, headers: headers)
}

private func decode(_ r: TestResponse) throws -> [String: Any] {
    guard let object = try JSONSerialization.jsonObject(with: Data(r.body)) as? [String: Any] else { throw Unexpected("not an echo", r) }
    return object
}

@Suite("Forwarder: one request relayed to the queue's owner and its answer relayed unchanged")
/// Each test runs on a thread of its own (`onThread`): they block on sockets and sleeps, up
/// to 5 s, and the cooperative pool has one thread per core, which other suites' awaits need
/// (a blocked pool made a 0.3 s long poll of another suite take 5 s).
struct ForwarderTests {
    /// When the owner's `/hold` saw its client leave.
    static let ownerSawClientGone = Lock<Date?>(nil)

    /// 1 MiB of every byte value, so a lossy decode anywhere would show.
    static let binary: [UInt8] = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 7) }

    @Test("a GET reaches the owner with its path, query, end-to-end headers and the forwarded-by mark")
    func relaysRequest() async throws {
        try await onThread {
            try withPair { owner, front, _ in
                let target = "/v1/queues/q%2Fx/echo?a=1%262&b=x%3Dy&c=100%25&d=1%2B1&e=two%20words&f=%C3%A9&empty="
                let headers = [
                    ("X-Custom", "kept"), ("Authorization", "Bearer t"), ("Idempotency-Key", "k-1"),
                    ("Keep-Alive", "timeout=5"), ("TE", "trailers"), ("Proxy-Authorization", "Basic x"),
                    ("Connection", "X-Hop"), ("X-Hop", "dropped"), ("User-Agent", "tester/1"),
                ]
                let direct = try decode(try send(owner.port, target, headers: headers))
                let r = try send(front.port, target, headers: headers)
                #expect(r.status == 200)
                #expect(r.headers["x-owner"] == "yes")
                let seen = try decode(r)
                #expect(seen["method"] as? String == "GET")
                #expect(seen["path"] as? String == "/v1/queues/q%2Fx/echo", "the raw path, not decoded")
                let query = seen["query"] as? [String: String] ?? [:]
                #expect(query == (direct["query"] as? [String: String]), "the owner decodes the same query as when asked directly")
                #expect(query["a"] == "1&2" && query["b"] == "x=y" && query["c"] == "100%" && query["d"] == "1+1")
                #expect(query["e"] == "two words" && query["f"] == "é" && query["empty"] == "")
                let h = seen["headers"] as? [String: String] ?? [:]
                #expect(h["opqd-forwarded-by"] == "instance-a")
                #expect(h["x-custom"] == "kept" && h["authorization"] == "Bearer t" && h["idempotency-key"] == "k-1")
                #expect(h["user-agent"] == "tester/1")
                for dropped in ["keep-alive", "te", "proxy-authorization", "x-hop"] {
                    #expect(h[dropped] == nil, "\(dropped) is hop-by-hop and must not reach the owner")
                }
                #expect(h["host"] == "127.0.0.1:\(owner.port)", "Host names the owner")
                // The owner must route exactly what this instance routed: no dot segments resolved.
                let dotted = try decode(try send(front.port, "/v1/queues/a/../b/./echo"))
                #expect(dotted["path"] as? String == "/v1/queues/a/../b/./echo")
                // Raw UTF-8 in a path (sent unencoded by some clients) is percent-encoded by libcurl on
                // the way; queue names are ASCII, so such a path names no queue either way.
                let raw = try decode(try send(front.port, "/v1/queues/é/echo"))
                #expect((raw["path"] as? String)?.lowercased() == "/v1/queues/%c3%a9/echo")
            }
        }
    }

    @Test("a POST body reaches the owner byte for byte, and an empty POST arrives with no body")
    func relaysBody() async throws {
        try await onThread {
            try withPair { _, front, _ in
                let body = Array(#"{"name":"é & \u0000 ünïcode"}"#.utf8) + [0, 255, 10, 13]
                let seen = try decode(try send(front.port, "POST", "/v1/queues", headers: [("Content-Type", "application/json")], body: body))
                #expect(seen["method"] as? String == "POST")
                #expect(Data(base64Encoded: seen["body"] as? String ?? "").map(Array.init) == body)
                #expect((seen["headers"] as? [String: String])?["content-type"] == "application/json")
                let empty = try decode(try send(front.port, "POST", "/v1/queues/q/resume", body: []))
                #expect(empty["method"] as? String == "POST" && empty["body"] as? String == "")
                let delete = try decode(try send(front.port, "DELETE", "/v1/queues/q"))
                #expect(delete["method"] as? String == "DELETE")
            }
        }
    }

    @Test("statuses, Location, ETag and problem bodies come back unchanged; a 302 is not followed")
    func relaysAnswers() async throws {
        try await onThread {
            try withPair { _, front, _ in
                let created = try send(front.port, "POST", "/created", body: [])
                #expect(created.status == 201 && created.headers["location"] == "/v1/operations/42" && created.text == #"{"id":"42"}"#)
                let notModified = try send(front.port, "/not-modified", headers: [("If-None-Match", "\"v7\"")])
                #expect(notModified.status == 304 && notModified.headers["etag"] == "\"v7\"" && notModified.body.isEmpty)
                let conflict = try send(front.port, "POST", "/conflict", body: [])
                expectProblem(conflict, 409)
                #expect(conflict.string("type") == "https://opqd.dev/problems/queue-exists")
                let moved = try send(front.port, "/moved")
                #expect(moved.status == 302 && moved.headers["location"] == "/echo" && moved.text == "see /echo", "\(moved)")
                #expect(moved.headers.values("date").count <= 1, "one Date field: \(moved.headers)")
            }
        }
    }

    @Test("HEAD is relayed as HEAD and answered without a body")
    func relaysHead() async throws {
        try await onThread {
            try withPair { _, front, _ in
                let r = try send(front.port, "HEAD", "/echo?x=1")
                #expect(r.status == 200 && r.body.isEmpty && r.headers["x-owner"] == "yes")
                // The connection is still in step: the next answer parses.
                #expect(try send(front.port, "GET", "/echo").status == 200)
            }
        }
    }

    @Test("a 1 MiB binary answer arrives byte for byte")
    func relaysBinary() async throws {
        try await onThread {
            try withPair { _, front, _ in
                let r = try send(front.port, "/binary")
                #expect(r.status == 200 && r.headers["content-type"] == "application/octet-stream")
                #expect(r.body.count == Self.binary.count && r.body == Self.binary)
            }
        }
    }

    @Test("an answer larger than the forwarder relays is 502, not a truncated 200")
    func tooLarge() async throws {
        try await onThread {
            try withPair(maxResponseBytes: 2 << 20) { _, front, _ in
                let r = try send(front.port, "/huge")
                expectProblem(r, 502, mentioning: ["larger than"])
                #expect(r.string("type") == "https://opqd.dev/problems/owner-answer-too-large")
            }
        }
    }

    @Test("50 sequential forwarded requests share one keep-alive connection to the owner")
    func keepAlive() async throws {
        try await onThread {
            // A raw owner, so that every connection it ever accepted is counted (an owner that
            // closed each connection after one answer would keep `openConnections` low too).
            let accepted = Lock(0)
            let owner = try RawServer(timeout: 2) { connection, _ in
                accepted.withLock { $0 += 1 }
                while let line = try? connection.readLine(), !line.isEmpty {
                    var length = 0
                    while let field = try? connection.readLine(), !field.isEmpty {
                        let lower = field.lowercased()
                        if lower.hasPrefix("content-length:") { length = Int(lower.dropFirst(15).trimmingCharacters(in: .whitespaces)) ?? 0 }
                    }
                    if length > 0 { _ = try? connection.readBytes(length) }
                    guard connection.send("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") else { return }
                }
            }
            defer { owner.stop() }
            try withFront(to: owner.base, maxResponseBytes: 1 << 20) { front, _ in
                let client = KeepAliveClient(port: front.port, retries: 0)
                for i in 0..<50 {
                    let r = try client.request(i % 2 == 0 ? "GET" : "POST", "/echo?i=\(i)", body: i % 2 == 0 ? nil : Array("{}".utf8))
                    #expect(r.status == 200 && r.text == "ok")
                }
                // The owner's handler holds its idle connection until its 2 s receive timeout: `stop` waits for it.
                #expect(accepted.withLock { $0 } == 1, "the owner accepted \(accepted.withLock { $0 }) connections for 50 requests")
            }
        }
    }

    @Test("nobody listening at the owner: 503 owner-unavailable with Retry-After, at once")
    func ownerDown() async throws {
        try await onThread {
            try withPair(ownerBase: "http://127.0.0.1:\(closedPort())") { _, front, _ in
                let start = Date()
                let r = try send(front.port, "POST", "/v1/queues/q/operations", body: Array("{}".utf8))
                #expect(Date().timeIntervalSince(start) < 3)
                expectProblem(r, 503, mentioning: ["may or may not", "Idempotency-Key"])
                #expect(r.string("type") == "https://opqd.dev/problems/owner-unavailable")
                #expect(r.headers["retry-after"] == "1")
            }
        }
    }

    @Test("an owner that cuts its answer short, or sends garbage, is 503, never a partial relay")
    func ownerMisbehaves() async throws {
        try await onThread {
            let owner = try RawServer { connection, _ in
                guard let line = try? connection.readLine() else { return }
                while let l = try? connection.readLine(), !l.isEmpty {}
                if line.contains("/short") {
                    _ = connection.send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
                } else {
                    _ = connection.send("NOT HTTP AT ALL\r\n\r\n")
                }
            }
            defer { owner.stop() }
            try withFront(to: owner.base, maxResponseBytes: 1 << 20) { front, _ in
                for path in ["/short", "/garbage"] {
                    let r = try send(front.port, path)
                    expectProblem(r, 503)
                    #expect(r.headers["retry-after"] == "1", "\(path)")
                }
            }
        }
    }

    @Test("an owner slower than the exchange may take is 503 at the deadline, not a hang")
    func ownerTooSlow() async throws {
        try await onThread {
            let owner = try RawServer(timeout: 5) { connection, server in
                while let l = try? connection.readLine(), !l.isEmpty {}
                // Holds the request past the forwarder's deadline, then answers anyway.
                _ = waitUntil(timeout: 2, every: 0.05) { server.isStopping }
                _ = connection.send("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            }
            defer { owner.stop() }
            try withFront(to: owner.base, maxResponseBytes: 1 << 20, requestTimeout: 0.5) { front, _ in
                let start = Date()
                let r = try send(front.port, "POST", "/v1/queues/q/operations", body: Array("{}".utf8))
                let took = Date().timeIntervalSince(start)
                expectProblem(r, 503, mentioning: ["timeout", "may or may not"])
                #expect(took >= 0.4 && took < 1.8, "answered after \(took) s")
            }
        }
    }

    @Test("while 20 long polls wait at the owner, a plain request through the same forwarder is answered at once")
    func noHeadOfLineBlocking() async throws {
        try await onThread {
            try withPair { _, front, _ in
                let polls = DispatchGroup()
                let answered = Lock(0)
                // Threads of their own: blocked on sockets, they must not take the global queue's
                // few workers, which run the owner's delayed answers.
                for _ in 0..<20 {
                    polls.enter()
                    Thread.detachNewThread {
                        if (try? send(front.port, "/slow?wait=5"))?.status == 200 { answered.withLock { $0 += 1 } }
                        polls.leave()
                    }
                }
                Thread.sleep(forTimeInterval: 0.3)
                let start = Date()
                let r = try send(front.port, "/echo")
                let took = Date().timeIntervalSince(start)
                #expect(r.status == 200)
                #expect(took < 0.5, "a plain request took \(took) s behind the long polls")
                #expect(polls.wait(timeout: .now() + 10) == .success)
                #expect(answered.withLock { $0 } == 20)
            }
        }
    }

    @Test("a long poll whose client leaves is let go of at the owner, so a claim is not handed to nobody")
    func clientLeavesLongPoll() async throws {
        try await onThread {
            try withPair { owner, front, _ in
                let connection = try RawConnection(port: front.port, timeout: 5)
                #expect(connection.send("POST /hold?wait=20 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"))
                #expect(waitUntil(timeout: 2) { owner.requestsInFlight == 1 }, "the long poll reached the owner")
                let left = Date()
                connection.close()
                #expect(waitUntil(timeout: 3, every: 0.01) { Self.ownerSawClientGone.withLock { $0 } != nil }, "the owner never saw the client leave")
                // Well before its wait of 20 s (about 0.3 s alone; 2 s seen in a loaded parallel run).
                if let seen = Self.ownerSawClientGone.withLock({ $0 }) { #expect(seen.timeIntervalSince(left) < 5) }
                #expect(waitUntil(timeout: 2) { front.requestsInFlight == 0 }, "the forwarding server let go of the request")
            }
        }
    }

    @Test("a URL the client library will not send (over 8 KiB) is 400 naming why, and nothing reaches the owner")
    func unsendable() async throws {
        try await onThread {
            try withPair { owner, front, _ in
                let r = try send(front.port, "/echo?big=" + String(repeating: "x", count: 9000))
                expectProblem(r, 400, mentioning: ["cannot be forwarded", "8192"])
                #expect(owner.openConnections == 0)
            }
        }
    }

    @Test("a long poll the owner answers after 1.5 s is relayed, not cut short")
    func longPoll() async throws {
        try await onThread {
            try withPair { _, front, _ in
                let start = Date()
                let r = try send(front.port, "/slow?wait=2")
                let took = Date().timeIntervalSince(start)
                #expect(r.status == 200 && r.text == "late 2")
                #expect(took >= 1.4, "answered after \(took) s")
            }
        }
    }

    @Test(
        "the exchange may take 30 s, or a long poll's wait plus 10 s (capped; a wait without timeout waits 30 s); bad waits mean 30 s",
        arguments: [
            ("/v1/x", [:], 30.0), ("/v1/x", ["wait": "2"], 30), ("/v1/x", ["wait": "0"], 30), ("/v1/x", ["wait": "45"], 55),
            ("/v1/x", ["timeout": "100.5"], 110.5), ("/v1/x", ["wait": "99999999"], 310), ("/v1/x", ["wait": "1e308"], 30),
            ("/v1/x", ["wait": "0x1p4"], 30), ("/v1/x", ["wait": "inf"], 30), ("/v1/x", ["wait": "nan"], 30), ("/v1/x", ["wait": "-5"], 30),
            ("/v1/x", ["wait": "abc"], 30), ("/v1/x", ["wait": String(repeating: "9", count: 400)], 30),
            ("/v1/operations/op-1/wait", [:], 40), ("/v1/queues/q/wait", [:], 40), ("/v1/queues/q/wait", ["timeout": "0"], 30),
            ("/v1/queues/q/wait", ["timeout": "300"], 310),
            // A queue or a schedule named "wait" is no wait.
            ("/v1/queues/wait", [:], 30), ("/v1/queues/q/schedules/wait", [:], 30),
        ] as [(String, [String: String], Double)])
    func timeouts(path: String, query: [String: String], expected: Double) {
        let forwarder = Forwarder(selfID: "a", maxResponseBytes: 1024, maxWaitSeconds: 300)
        let request = forwarder.outboundRequest(for: HTTPRequest(method: "GET", path: path, query: query), base: "http://h:1/")
        #expect(forwarder.exchangeTimeout(HTTPRequest(method: "GET", path: path, query: query)) == expected)
        #expect(request.timeout == expected && request.connectTimeout == 2)
        #expect(!request.followRedirects && !request.useProxy && request.pathAsIs)
        #expect(request.url.hasPrefix("http://h:1" + path))
    }

    @Test("the owner's hop-by-hop and Content-Length fields are not relayed; the rest are, in order")
    func answerHeaders() {
        let answer = OutboundResponse(
            status: 201,
            headers: [
                ("Location", "/a"), ("Connection", "keep-alive, X-Hop"), ("Keep-Alive", "timeout=5"), ("X-Hop", "1"),
                ("Transfer-Encoding", "chunked"), ("Content-Length", "2"), ("Upgrade", "h2c"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
            ],
            body: [1, 2])
        let r = Forwarder.relay(.success(answer), maxResponseBytes: 10)
        #expect(r.status == 201 && r.body == [1, 2])
        #expect(r.headers.map(\.0) == ["Location", "Set-Cookie", "Set-Cookie"])
        #expect(r.headers.map(\.1) == ["/a", "a=1", "b=2"])
    }

    @Test("a request already forwarded is recognised, so the receiver never forwards it again")
    func loopGuard() {
        #expect(Forwarder.wasForwarded(HTTPRequest(method: "GET", path: "/", headers: ["opqd-forwarded-by": "b"])))
        #expect(!Forwarder.wasForwarded(HTTPRequest(method: "GET", path: "/")))
        // A client cannot pass its own mark through: the forwarder writes its own.
        let f = Forwarder(selfID: "me", maxResponseBytes: 1, maxWaitSeconds: 1)
        let out = f.outboundRequest(for: HTTPRequest(method: "GET", path: "/", headers: ["opqd-forwarded-by": "spoof"]), base: "http://h")
        #expect(out.headers.filter { $0.0.lowercased() == "opqd-forwarded-by" }.map(\.1) == ["me"])
    }

    /// A figure for the README, not a check: run with `OPQD_FORWARD_LATENCY=1`.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["OPQD_FORWARD_LATENCY"] == "1"))
    func latency() async throws {
        try await onThread {
            try withPair { owner, front, _ in
                func run(_ port: Int) throws -> (p50: Double, p99: Double) {
                    let client = KeepAliveClient(port: port, retries: 0)
                    for _ in 0..<200 { _ = try client.request("GET", "/created") }
                    var micros: [Double] = []
                    for _ in 0..<2000 {
                        let t = DispatchTime.now().uptimeNanoseconds
                        _ = try client.request("GET", "/created")
                        micros.append(Double(DispatchTime.now().uptimeNanoseconds - t) / 1000)
                    }
                    micros.sort()
                    return (micros[1000], micros[1980])
                }
                let direct = try run(owner.port)
                let forwarded = try run(front.port)
                print(
                    "forwarder latency, 2000 GETs on loopback, µs: direct p50 \(direct.p50) p99 \(direct.p99); forwarded p50 \(forwarded.p50) p99 \(forwarded.p99)"
                )
            }
        }
    }
}
