import Foundation
import OutboundHTTP
import QueueEngine
import QueueKinds
import Testing

extension KindsTests {
    /// What an `http` operation's end tells its host's breaker (API.md "Hosts"), and the
    /// `Retry-After` grammar it reads.
    @Suite struct HTTPHosts {
        @Test func theHostIsTheURLsHostAndPortLowercase() {
            let kind = HTTPKind()
            func host(_ url: String) -> String? { kind.host(spec: .object([("method", .string("GET")), ("url", .string(url))])) }
            #expect(host("http://API.Example.com/x") == "api.example.com:80")
            #expect(host("https://api.example.com/x") == "api.example.com:443")
            #expect(host("https://user:pw@api.example.com:8443/x?q") == "api.example.com:8443")
            #expect(host("http://[::1]:8080/") == "[::1]:8080")
            #expect(host("ftp://a/") == nil)
            #expect(host("not a url") == nil)
            #expect(kind.host(spec: nil) == nil)
            #expect(kind.host(spec: .string("x")) == nil)
        }

        @Test func eachAnswerHasItsVerdict() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let base = server.base
            func run(_ path: String, _ extra: String = "") throws {
                _ = try h.run("http", #"{"method": "GET", "url": "\#(base)\#(path)", "timeout": 1\#(extra)}"#)
            }
            let name = "127.0.0.1:\(server.port)"
            try run("/ok")
            #expect(try h.engine.host(named: name).consecutiveFailures == 0)
            for _ in 0..<4 { try run("/status/500") }
            #expect(try h.engine.host(named: name).consecutiveFailures == 4, "a 5xx is a failure of the host")
            try run("/status/404")
            #expect(try h.engine.host(named: name).consecutiveFailures == 0, "a 4xx is no failure: it resets the count")
            for _ in 0..<3 { try run("/status/500", #", "expectStatus": ["5xx"]"#) }
            #expect(try h.engine.host(named: name).consecutiveFailures == 0, "an expected status is healthy")
            for _ in 0..<5 { try run("/status/502") }
            let open = try h.engine.host(named: name)
            #expect(open.state == .open && open.lastError?["type"] == .string("http-status"))
        }

        @Test func aRefusedConnectionIsAFailure() throws {
            let port = closedPort()
            let h = try Harness()
            _ = try h.run("http", #"{"method": "GET", "url": "http://127.0.0.1:\#(port)/", "timeout": 1}"#)
            let host = try h.engine.host(named: "127.0.0.1:\(port)")
            #expect(host.consecutiveFailures == 1 && host.lastError?["type"] == .string("connection-refused"))
        }

        @Test func a429OrA503WithRetryAfterHoldsTheHostWithoutAnAttempt() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let id = try h.add("http", #"{"method": "GET", "url": "\#(server.base)/throttle/429/30"}"#)
            let name = "127.0.0.1:\(server.port)"
            #expect(waitUntil(timeout: 5) { (try? h.engine.host(named: name).throttledUntil) != nil })
            let op = try h.engine.operation(id)
            #expect(op.state == .ready && op.attempt == 1, "back to ready, its attempt unused")
            let until = try #require(try h.engine.host(named: name).throttledUntil)
            let wait = Double(until.nanoseconds - SystemClock().now().nanoseconds) / 1e9
            #expect((28...30.1).contains(wait), "held for the 30 s it asked: \(wait)")
            let busy = try TargetServer()
            defer { busy.stop() }
            let date = "Sun,%2006%20Nov%202094%2008:49:37%20GMT"
            let b = try h.add("http", #"{"method": "GET", "url": "\#(busy.base)/throttle/503/\#(date)"}"#)
            let other = "127.0.0.1:\(busy.port)"
            #expect(waitUntil(timeout: 5) { (try? h.engine.host(named: other).throttledUntil) != nil })
            #expect(try h.engine.operation(b).state == .ready)
            let cut = try #require(try h.engine.host(named: other).throttledUntil)
            let held = Double(cut.nanoseconds - SystemClock().now().nanoseconds) / 1e9
            #expect((3590...3600.1).contains(held), "a date decades ahead is cut to an hour: \(held)")
        }

        @Test func a503WithoutRetryAfterIsAFailure() {
            let spec = JSONValue.object([("method", .string("GET")), ("url", .string("http://a/"))])
            func response(_ status: Int, _ headers: [(String, String)] = []) -> Result<OutboundResponse, OutboundError> {
                .success(
                    OutboundResponse(
                        status: status, headers: headers, body: [], truncated: false, size: 0, contentLength: nil, finalURL: "http://a/",
                        redirects: 0))
            }
            #expect(HTTPKind.verdict(spec: spec, outcome: response(503), now: 0) == .failure)
            #expect(HTTPKind.verdict(spec: spec, outcome: response(503, [("retry-after", "7")]), now: 0) == .throttle(retryAfter: 7))
            #expect(HTTPKind.verdict(spec: spec, outcome: response(503, [("Retry-After", "soon")]), now: 0) == .failure)
            #expect(HTTPKind.verdict(spec: spec, outcome: response(429), now: 0) == .throttle(retryAfter: nil))
            #expect(HTTPKind.verdict(spec: spec, outcome: response(418), now: 0) == .healthy)
            #expect(HTTPKind.verdict(spec: spec, outcome: .failure(OutboundError(type: "dns", detail: "")), now: 0) == .failure)
            #expect(HTTPKind.verdict(spec: spec, outcome: .failure(OutboundError(type: "too-many-redirects", detail: "")), now: 0) == nil)
            #expect(HTTPKind.verdict(spec: .null, outcome: response(500), now: 0) == nil)
        }
    }
}
