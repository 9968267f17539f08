import Foundation
import OutboundHTTP
import QueueEngine
import QueueKinds
import Testing

extension KindsTests {
    /// What an `http` operation's end tells its host's breaker (API.md "Hosts"), and the
    /// `Retry-After` grammar it reads.
    @Suite struct HTTPHosts {
        static let kind = HTTPKind()
        static func host(_ url: String) -> String? { kind.host(spec: .object([("method", .string("GET")), ("url", .string(url))])) }

        @Test func theHostIsTheURLsHostAndPortLowercaseThePortAlwaysWritten() {
            let host = Self.host
            #expect(host("http://api.example.com/x") == "api.example.com:80")
            #expect(host("https://api.example.com/x") == "api.example.com:443")
            #expect(host("http://api.example.com:80/") == "api.example.com:80", "the default port written or not: one host")
            #expect(host("http://api.example.com:0080/") == "api.example.com:80")
            #expect(host("https://api.example.com:80/") == "api.example.com:80", "https to port 80 is port 80")
            #expect(host("http://api.example.com:443/") == "api.example.com:443")
            #expect(host("http://api.example.com:8080") == "api.example.com:8080", "no path")
            #expect(host("HTTP://API.Example.COM/x") == "api.example.com:80", "any case, scheme too")
            #expect(host("http://%41PI.example.com/") == "api.example.com:80", "percent-encoded, as the request decodes it")
            #expect(host("https://user:pw@api.example.com:8443/x?q#f") == "api.example.com:8443", "user info is not part of the host")
            #expect(host("https://user@api.example.com/") == "api.example.com:443")
            #expect(host("http://under_score.example/") == "under_score.example:80")
            #expect(host("http://127.0.0.1:9/") == "127.0.0.1:9")
            #expect(host("http://127.1/") == "127.0.0.1:80", "an IPv4 address as the request reads it")
            #expect(host("http://0x7f.0.0.1/") == "127.0.0.1:80")
            #expect(host("http:///x/y") == "x:80", "as the request reads it: host x")
        }

        @Test func anIPv6AddressIsInBracketsLowercase() {
            let host = Self.host
            #expect(host("http://[::1]:8080/") == "[::1]:8080")
            #expect(host("http://[::1]/") == "[::1]:80")
            #expect(host("https://[::1]/") == "[::1]:443")
            #expect(host("http://[FE80::ABCD]:8080/") == "[fe80::abcd]:8080")
            #expect(host("http://[0:0:0:0:0:0:0:1]/") == "[::1]:80", "as the request reads it")
            #expect(host("http://[::ffff:127.0.0.1]/") == "[::ffff:127.0.0.1]:80")
            #expect(host("http://u:p@[::1]:8080/") == "[::1]:8080")
            #expect(host("http://[fe80::1%25eth0]:8080/") == nil, "a zone: untracked, neither merged with another zone nor named with a %")
        }

        /// libcurl puts an international name in ASCII (IDNA, libidn2) only in a process whose
        /// locale is UTF-8 (opqd sets one at start; HostileTargetTests.internationalizedHost
        /// sees the name go out); in the C locale (this test's) the request itself fails before
        /// anything is sent. Either way the name agrees with the request.
        @Test func anInternationalNameIsInPunycodeWhenTheRequestCanUseIt() throws {
            let host = Self.host
            #expect(host("https://xn--bcher-kva.example/") == "xn--bcher-kva.example:443")
            let name = host("http://bücher.example:9/")
            #expect(name == nil || name == "xn--bcher-kva.example:9")
            #expect(host("http://BÜCHER.example:9/") == name, "the same host in any case")
            guard name == nil else { return }
            let h = try Harness()
            let op = try h.run("http", #"{"method": "GET", "url": "http://bücher.example:9/", "timeout": 1}"#)
            #expect(op.errorType == "invalid-spec", "not sent: no host to hold")
            #expect(h.engine.hosts().isEmpty)
        }

        @Test func anInvalidSpecOrURLHasNoHost() {
            let kind = Self.kind
            let host = Self.host
            for url in ["ftp://a/", "not a url", "", "http://", "http://a b/", "http://a:65536/", "http://[::1/", "//a/", "/x", "file:///etc/passwd"] {
                #expect(host(url) == nil, "\(url)")
            }
            #expect(kind.host(spec: nil) == nil)
            #expect(kind.host(spec: .string("http://a/")) == nil)
            #expect(kind.host(spec: .object([("url", .string("http://a/"))])) == nil, "no method: the spec is invalid, never sent")
            #expect(kind.host(spec: .object([("method", .string("GET")), ("url", .string("http://a/")), ("extra", .bool(true))])) == nil)
            #expect(kind.host(spec: .object([("method", .string("GET")), ("url", .string("http://a/")), ("timeout", .number(-1))])) == nil)
            #expect(kind.host(spec: .object([("method", .string("GET")), ("url", .number(1))])) == nil)
            let post = JSONValue.object([("method", .string("POST")), ("url", .string("http://a/")), ("body", .object([("k", .array([.null]))]))])
            #expect(kind.host(spec: post) == "a:80")
        }

        @Test func aTargetTheHostsAPICannotNameIsUntracked() {
            let host = Self.host
            #expect(host("http://a:0/") == nil, "port 0")
            #expect(host("http://a~b/") == nil)
            #expect(host("http://a|b/") == nil)
            #expect(host("http://" + String(repeating: "a", count: 254) + "/") == nil, "longer than any DNS name")
            #expect(host("http://" + String(repeating: "a", count: 253) + "/") == String(repeating: "a", count: 253) + ":80")
        }

        /// API.md "Hosts": `GET`/`PATCH /v1/hosts/{host}` take `host:port`, lowercase, letters,
        /// digits, `.`, `-`, `_` (IPv6: hex digits, `:` and `.` in brackets), port 1-65535.
        @Test func everyHostIsOneTheHostsAPICanName() {
            let urls = [
                "http://API.Example.com/", "https://xn--bcher-kva.example/", "http://[FE80::ABCD]:1/", "http://127.1:65535/",
                "http://[::ffff:1.2.3.4]/", "http://a.-_.b/", "http://%41/", "http://xn--cole-9oa.example:8443/",
            ]
            for url in urls {
                let name = Self.host(url)
                #expect(name.map(Self.nameableByTheAPI) == true, "\(url) -> \(name ?? "nil")")
            }
        }

        static func nameableByTheAPI(_ name: String) -> Bool {
            guard let colon = name.lastIndex(of: ":"), let port = Int(name[name.index(after: colon)...]), (1...65535).contains(port) else { return false }
            let host = name[..<colon]
            guard host == host.lowercased() else { return false }
            if host.hasPrefix("[") {
                return host.hasSuffix("]") && host.count <= 64
                    && host.dropFirst().dropLast().allSatisfy { $0.isASCII && ($0.isHexDigit || $0 == ":" || $0 == ".") }
            }
            return !host.isEmpty && host.utf8.count <= 253 && host.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "._-".contains($0)) }
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

        @Test func a503WithoutAUsableRetryAfterAndATimeoutAreFailures() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let name = "127.0.0.1:\(server.port)"
            func failures() throws -> Int { try h.engine.host(named: name).consecutiveFailures }
            _ = try h.run("http", #"{"method": "GET", "url": "\#(server.base)/status/503", "timeout": 1}"#)
            #expect(try failures() == 1, "a 503 without Retry-After")
            _ = try h.run("http", #"{"method": "GET", "url": "\#(server.base)/throttle/503/soon", "timeout": 1}"#)
            #expect(try failures() == 2, "a 503 whose Retry-After cannot be read")
            _ = try h.run("http", #"{"method": "GET", "url": "\#(server.base)/twice/503/5/6", "timeout": 1}"#)
            #expect(try failures() == 3, "a 503 with two Retry-After that disagree")
            let slow = try h.run("http", #"{"method": "GET", "url": "\#(server.base)/slow", "timeout": 0.3}"#)
            #expect(slow.errorType == "timeout")
            #expect(try failures() == 4, "a timeout")
            #expect(try h.engine.host(named: name).lastError?["type"] == .string("timeout"))
        }

        @Test func aRefusedRedirectSaysNothingAboutTheHost() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let name = "127.0.0.1:\(server.port)"
            func run(_ path: String) throws -> OperationSnapshot {
                try h.run("http", #"{"method": "GET", "url": "\#(server.base)\#(path)", "timeout": 2}"#)
            }
            for _ in 0..<2 { _ = try run("/status/500") }
            #expect(try h.engine.host(named: name).consecutiveFailures == 2)
            #expect(try run("/loop").errorType == "too-many-redirects")
            #expect(try run("/to-file").errorType == "redirect-refused")
            #expect(try h.engine.host(named: name).consecutiveFailures == 2, "neither a failure nor healthy: the count stays")
            _ = try run("/status/404")
            #expect(try h.engine.host(named: name).consecutiveFailures == 0)
        }

        @Test func a429WithoutAUsableRetryAfterWaitsOneSecond() throws {
            for path in ["/status/429", "/throttle/429/soon", "/twice/429/5/6"] {
                let server = try TargetServer()
                defer { server.stop() }
                let h = try Harness()
                let name = "127.0.0.1:\(server.port)"
                let id = try h.add("http", #"{"method": "GET", "url": "\#(server.base)\#(path)"}"#)
                #expect(waitUntil(timeout: 5) { (try? h.engine.host(named: name).throttledUntil) != nil }, "\(path)")
                let until = try #require(try h.engine.host(named: name).throttledUntil)
                let wait = Double(until.nanoseconds - SystemClock().now().nanoseconds) / 1e9
                #expect(wait <= 1.05, "\(path): no time named, the first wait is 1 s: \(wait)")
                let op = try h.engine.operation(id)
                #expect(op.attempt == 1 && op.state != .finished, "\(path): its attempt unused")
                #expect(try h.engine.host(named: name).consecutiveFailures == 0, "\(path): no failure")
                _ = try h.engine.cancel(id)
            }
        }

        @Test func twoRetryAftersThatAgreeAreObeyed() throws {
            let server = try TargetServer()
            defer { server.stop() }
            let h = try Harness()
            let name = "127.0.0.1:\(server.port)"
            let id = try h.add("http", #"{"method": "GET", "url": "\#(server.base)/twice/503/30/30"}"#)
            #expect(waitUntil(timeout: 5) { (try? h.engine.host(named: name).throttledUntil) != nil })
            let until = try #require(try h.engine.host(named: name).throttledUntil)
            let wait = Double(until.nanoseconds - SystemClock().now().nanoseconds) / 1e9
            #expect((28...30.1).contains(wait), "\(wait)")
            _ = try h.engine.cancel(id)
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

        @Test func everyEndHasItsVerdict() {
            let spec = JSONValue.object([("method", .string("GET")), ("url", .string("http://a/"))])
            let expect5xx = JSONValue.object([
                ("method", .string("GET")), ("url", .string("http://a/")), ("expectStatus", .array([.number(429), .number(503), .string("5xx")])),
            ])
            func response(_ status: Int, _ headers: [(String, String)] = []) -> Result<OutboundResponse, OutboundError> {
                .success(
                    OutboundResponse(
                        status: status, headers: headers, body: [], truncated: false, size: 0, contentLength: nil, finalURL: "http://a/",
                        redirects: 0))
            }
            func verdict(_ outcome: Result<OutboundResponse, OutboundError>, spec: JSONValue = spec, now: Double = 784_111_777) -> HostVerdict? {
                HTTPKind.verdict(spec: spec, outcome: outcome, now: now)
            }
            for type in ["timeout", "connection-refused", "dns", "tls", "network", "invalid-response"] {
                #expect(verdict(.failure(OutboundError(type: type, detail: "x"))) == .failure, "\(type)")
            }
            for type in ["too-many-redirects", "redirect-refused", "invalid-url", "invalid-spec", "cancelled", "", "something-new"] {
                #expect(verdict(.failure(OutboundError(type: type, detail: "x"))) == nil, "\(type)")
            }
            for status in [100, 101, 200, 204, 301, 304, 400, 401, 403, 404, 408, 418, 499, 600, 999] {
                #expect(verdict(response(status)) == .healthy, "\(status)")
            }
            for status in [500, 501, 502, 503, 504, 599] {
                #expect(verdict(response(status)) == .failure, "\(status)")
                #expect(verdict(response(status), spec: expect5xx) == .healthy, "\(status) expected")
            }
            #expect(verdict(response(429), spec: expect5xx) == .healthy, "an expected 429 too")
            #expect(verdict(response(429, [("Retry-After", "30")]), spec: expect5xx) == .healthy)
            #expect(verdict(response(503, [("Retry-After", "30")]), spec: expect5xx) == .healthy)
            #expect(verdict(response(429, [("Retry-After", "30")])) == .throttle(retryAfter: 30))
            #expect(verdict(response(429, [("Retry-After", "Sun, 06 Nov 1994 08:50:37 GMT")])) == .throttle(retryAfter: 60))
            #expect(verdict(response(429, [("Retry-After", "Sun, 06 Nov 1994 08:48:37 GMT")])) == .throttle(retryAfter: 0), "a past date")
            #expect(verdict(response(429, [("Retry-After", "-3")])) == .throttle(retryAfter: nil))
            #expect(verdict(response(503, [("Retry-After", "0")])) == .throttle(retryAfter: 0))
            #expect(verdict(response(503, [("Retry-After", "Sunday, 06-Nov-94 08:50:37 GMT")])) == .throttle(retryAfter: 60))
            #expect(verdict(response(503, [("Retry-After", "Sun Nov  6 08:50:37 1994")])) == .throttle(retryAfter: 60))
            #expect(verdict(response(503, [("Retry-After", "1"), ("Retry-After", "2")])) == .failure)
            #expect(verdict(response(503, [("Retry-After", "")])) == .failure)
            #expect(verdict(response(502, [("Retry-After", "5")])) == .failure, "only 503 and 429 ask to slow down")
            #expect(verdict(response(404, [("Retry-After", "5")])) == .healthy)
            #expect(verdict(response(503, [("Retry-After", String(repeating: "9", count: 1000))])) == .throttle(retryAfter: RetryAfter.maxSeconds))
            // Any now is safe: a date needs a finite one, seconds do not.
            for now in [Double.nan, .infinity, -.infinity] {
                #expect(verdict(response(503, [("Retry-After", "Sunday, 06-Nov-94 08:50:37 GMT")]), now: now) == .failure)
                #expect(verdict(response(429, [("Retry-After", "Sun, 06 Nov 1994 08:50:37 GMT")]), now: now) == .throttle(retryAfter: nil))
                #expect(verdict(response(503, [("Retry-After", "7")]), now: now) == .throttle(retryAfter: 7))
            }
            // An invalid spec is never sent: no verdict, whatever the outcome.
            for bad in [JSONValue.null, .string("x"), .object([("url", .string("http://a/"))])] {
                #expect(verdict(response(500), spec: bad) == nil)
                #expect(verdict(.failure(OutboundError(type: "timeout", detail: "")), spec: bad) == nil)
            }
        }
    }
}
