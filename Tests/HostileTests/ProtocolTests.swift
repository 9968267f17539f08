import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Hostile bytes on the wire: header and body sizes at and past their bounds, lengths that
/// overflow, pipelining, HTTP/1.0, invalid UTF-8 and NUL bytes, very long targets.
@Suite("Hostile requests on the wire")
struct ProtocolTests {
    /// A request whose request line and header lines (each with its CRLF, plus the empty line)
    /// add up to exactly `total` bytes.
    static func request(totalHeadBytes total: Int, target: String = "/v1/queues") -> String {
        let fixed = ["GET \(target) HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        let used = fixed.reduce(0) { $0 + $1.utf8.count + 2 } + "X-Pad: ".utf8.count + 2 + 2
        return fixed.joined(separator: "\r\n") + "\r\nX-Pad: " + String(repeating: "a", count: total - used) + "\r\n\r\n"
    }

    @Test("a head of exactly 16384 bytes is served and one past it answers 431 headers-too-large (problem+json)")
    func headerBytesAtAndPastTheBound() async throws {
        let server = try Opqd()
        try await blocking {
            // At the bound: even counting every CRLF and the empty line, the head is 16384 bytes.
            let at = Self.request(totalHeadBytes: 16384)
            switch server.raw(at) {
            case let .success(r): #expect(r.status == 200, "a 16384-byte head: \(r.status) \(r.text.prefix(200))")
            case let .failure(e): Issue.record("a 16384-byte head: \(e)")
            }
            // Past the bound: even without any CRLF, the lines add up to more than 16384.
            let past = Self.request(totalHeadBytes: 16384 + 2 * 4 + 2 + 1)
            switch server.raw(past) {
            case let .success(r): expectProblem(r, 431, slug: "headers-too-large", "a head 1 byte past 16384")
            case let .failure(e): Issue.record("a head past 16384 bytes: no answer (\(e)); expected 431")
            }
            // Many small headers past the bound, and one huge header.
            var many = "GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            for i in 0..<2000 { many += "X-H\(i): v\r\n" }  // ~23 KB of short lines
            switch server.raw(many + "\r\n") {
            // Past our byte limit; whether MHD's per-connection pool (4x the limit) holds 2000
            // lines of bookkeeping decides who answers: our problem+json or MHD's own HTML 431.
            case let .success(r): #expect(r.status == 431, "2000 small headers: \(r.status) \(r.text.prefix(200))")
            case let .failure(e): Issue.record("2000 small headers: no answer (\(e)); expected 431")
            }
            let huge = "GET /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Huge: " + String(repeating: "h", count: 1 << 20) + "\r\n\r\n"
            switch server.raw(huge) {
            // Past libmicrohttpd's per-connection pool (10x the limit), MHD 0.9.75 answers 431 itself
            // with its own HTML body before any callback of ours runs: the status is all we control.
            case let .success(r): #expect(r.status == 431, "a 1 MiB header: \(r.status) \(r.text.prefix(200))")
            case let .failure(e): Issue.record("a 1 MiB header: no answer (\(e)); expected 431")
            }
            server.expectAlive("oversized heads")
        }
    }

    @Test("a body over --max-body answers 413 payload-too-large, declared or chunked, before it is read, and creates nothing")
    func bodyOverTheLimit() async throws {
        let server = try Opqd(["--max-body", "4096"])
        try await blocking {
            // Exactly at the limit: fine.
            let base = #"{"name":"exact"}"#
            let exact = base + String(repeating: " ", count: 4096 - base.utf8.count)
            #expect(try server.request("POST", "/v1/queues", json: exact).status == 201, "a body of exactly --max-body")
            // One byte over, declared.
            let over = #"{"name":"over"}"# + String(repeating: " ", count: 4097 - #"{"name":"over"}"#.utf8.count)
            expectProblem(try server.request("POST", "/v1/queues", json: over), 413, slug: "payload-too-large", "4097 declared bytes")
            // 10 MiB declared, nothing sent: the answer comes before the body (which never comes,
            // so the read's 10 s is only a limit to give up at).
            let c = try RawConnection(port: server.port, timeout: 10)
            c.send("POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n\r\n")
            do {
                let r = try c.readResponse(requestMethod: "POST")
                expectProblem(r, 413, slug: "payload-too-large", "10 MiB declared, not sent")
            } catch { Issue.record("10 MiB declared: no 413 before the body was sent (\(error))") }
            c.close()
            // Chunked, over the limit in several chunks.
            var chunked =
                "POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            let piece = String(repeating: " ", count: 1000)
            chunked += "f\r\n{\"name\":\"chnk\"}\r\n"
            for _ in 0..<5 { chunked += "3e8\r\n\(piece)\r\n" }
            chunked += "0\r\n\r\n"
            switch server.raw(chunked) {
            case let .success(r): expectProblem(r, 413, slug: "payload-too-large", "5015 chunked bytes")
            case let .failure(e): Issue.record("chunked over the limit: no answer (\(e))")
            }
            // Chunked within the limit: fine.
            let small =
                "POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"nam\r\na\r\ne\":\"chok\"}\r\n0\r\n\r\n"
            switch server.raw(small) {
            case let .success(r): #expect(r.status == 201, "a small chunked create: \(r)")
            case let .failure(e): Issue.record("a small chunked create: \(e)")
            }
            let names = (try server.request("GET", "/v1/queues").objects("queues")).compactMap { $0["name"] as? String }.sorted()
            #expect(names == ["chok", "exact"], "queues after the oversized bodies: \(names)")
            server.expectAlive("oversized bodies")
        }
    }

    @Test("Content-Length that overflows, is negative or is doubled, and chunk sizes that overflow, are refused and kill nothing")
    func lengthsThatOverflow() async throws {
        let server = try Opqd()
        try await blocking {
            let head = "POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
            let body = #"{"name":"len"}"#
            let cases: [(String, String)] = [
                ("Content-Length 99999999999999999999999", head + "Content-Length: 99999999999999999999999\r\n\r\n" + body),
                ("Content-Length 18446744073709551616", head + "Content-Length: 18446744073709551616\r\n\r\n" + body),
                ("Content-Length 9223372036854775807", head + "Content-Length: 9223372036854775807\r\n\r\n" + body),
                ("Content-Length -1", head + "Content-Length: -1\r\n\r\n" + body),
                ("Content-Length -14", head + "Content-Length: -14\r\n\r\n" + body),
                ("Content-Length +14", head + "Content-Length: +14\r\n\r\n" + body),
                ("Content-Length 0x0e", head + "Content-Length: 0x0e\r\n\r\n" + body),
                ("two different Content-Length", head + "Content-Length: 14\r\nContent-Length: 2\r\n\r\n" + body),
                ("Content-Length and chunked", head + "Content-Length: 14\r\nTransfer-Encoding: chunked\r\n\r\n" + body),
                ("chunk size ffffffffffffffffff", head + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n" + body + "\r\n0\r\n\r\n"),
                ("chunk size ffffffffffffffff", head + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n" + body + "\r\n0\r\n\r\n"),
                ("chunk size 8000000000000000", head + "Transfer-Encoding: chunked\r\n\r\n8000000000000000\r\n" + body + "\r\n0\r\n\r\n"),
                ("chunk size 7fffffffffffffff", head + "Transfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\n" + body + "\r\n0\r\n\r\n"),
                ("chunk size -1", head + "Transfer-Encoding: chunked\r\n\r\n-1\r\n" + body + "\r\n0\r\n\r\n"),
                (
                    "two chunks that add up past Int.max",
                    head + "Transfer-Encoding: chunked\r\n\r\n7ffffffffffffff0\r\nab\r\n7ffffffffffffff0\r\ncd\r\n0\r\n\r\n"
                ),
                ("Transfer-Encoding gzip, chunked", head + "Transfer-Encoding: gzip, chunked\r\n\r\ne\r\n" + body + "\r\n0\r\n\r\n"),
            ]
            for (what, request) in cases {
                switch server.raw(request, timeout: 3) {
                case let .success(r):
                    #expect(r.status >= 400 && r.status < 500, "\(what): \(r.status) \(r.text.prefix(200))")
                case .failure:
                    break  // closing the connection is a refusal too
                }
                server.expectAlive(what)
            }
            let names = (try server.request("GET", "/v1/queues").objects("queues")).compactMap { $0["name"] as? String }
            #expect(names.isEmpty, "queues created by malformed lengths: \(names)")
        }
    }

    @Test("three pipelined requests in one write get three answers in order")
    func pipelining() async throws {
        let server = try Opqd()
        try await blocking {
            let body = #"{"name":"piped"}"#
            let c = try RawConnection(port: server.port, timeout: 10)
            defer { c.close() }
            c.send(
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                    + "POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
                    + "GET /v1/queues/piped HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            let statuses = try (0..<3).map { i in try c.readResponse(requestMethod: i == 1 ? "POST" : "GET").status }
            #expect(statuses == [200, 201, 200], "pipelined answers: \(statuses)")
            server.expectAlive("pipelining")
        }
    }

    @Test("HTTP/1.0 requests are served, odd versions refused, and neither kills the server")
    func httpOnePointZero() async throws {
        let server = try Opqd()
        try await blocking {
            let body = #"{"name":"old"}"#
            switch server.raw("POST /v1/queues HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)") {
            case let .success(r): #expect(r.status == 201, "an HTTP/1.0 create: \(r)")
            case let .failure(e): Issue.record("an HTTP/1.0 create: \(e)")
            }
            switch server.raw("GET /v1/queues/old HTTP/1.0\r\n\r\n") {
            case let .success(r): #expect(r.status == 200, "an HTTP/1.0 read: \(r)")
            case let .failure(e): Issue.record("an HTTP/1.0 read: \(e)")
            }
            for request in [
                "GET /v1/queues\r\n\r\n", "GET /v1/queues HTTP/2.0\r\nHost: x\r\n\r\n", "GET /v1/queues HTTP/1.1\r\n\r\n",
                "GET /v1/queues HTTP/9.9\r\nHost: x\r\n\r\n", "GET /v1/queues HTTP/1.1 extra\r\nHost: x\r\n\r\n",
                "get /v1/queues HTTP/1.1\r\nHost: x\r\n\r\n", " GET /v1/queues HTTP/1.1\r\nHost: x\r\n\r\n",
                "GET  /v1/queues  HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\n\r\n", "GET /v1/queues HTTP/1.1\nHost: x\n\n",
                "GET /v1/queues HTTP/1.1\r\nHost: x\r\n folded: header\r\n\r\n", "GET /v1/queues HTTP/1.1\r\n: empty\r\n\r\n",
            ] {
                if case let .success(r) = server.raw(request, timeout: 3) {
                    #expect(r.status < 500 || r.status == 505, "\(request.debugDescription): \(r.status)")
                }
                server.expectAlive(request.debugDescription)
            }
        }
    }

    @Test("invalid UTF-8 and NUL bytes in path, query, headers and body are refused with 4xx and kill nothing")
    func invalidUTF8AndNUL() async throws {
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"u"}"#).expecting(201)
            func request(_ target: [UInt8], headers: [UInt8] = [], body: [UInt8]? = nil, method: String = "GET") -> [UInt8] {
                var r = Array("\(method) ".utf8) + target + Array(" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".utf8) + headers
                if let body { r += Array("Content-Type: application/json\r\nContent-Length: \(body.count)\r\n".utf8) }
                r += Array("\r\n".utf8) + (body ?? [])
                return r
            }
            let cases: [(String, [UInt8])] = [
                ("raw 0xFF in the path", request(Array("/v1/queues/".utf8) + [0xFF, 0xFE])),
                ("%FF in the path", request(Array("/v1/queues/%FF%FE".utf8))),
                ("overlong UTF-8 in the path", request(Array("/v1/queues/".utf8) + [0xC0, 0xAF])),
                ("a lone surrogate in the path", request(Array("/v1/queues/".utf8) + [0xED, 0xA0, 0x80])),
                ("%00 in the path", request(Array("/v1/queues/u%00x".utf8))),
                ("raw NUL in the path", request(Array("/v1/queues/u".utf8) + [0x00] + Array("x".utf8))),
                ("raw 0xFF in the query", request(Array("/v1/events?after=".utf8) + [0xFF])),
                ("%FF in the query", request(Array("/v1/events?after=%FF&limit=%00".utf8))),
                ("%-garbage in the query", request(Array("/v1/events?after=%&limit=%G1&%=%".utf8))),
                ("NUL in the query", request(Array("/v1/queues/u/operations?state=".utf8) + [0x00])),
                ("0xFF in a header value", request(Array("/v1/queues".utf8), headers: Array("X-Bad: ".utf8) + [0xFF, 0xFE] + Array("\r\n".utf8))),
                ("NUL in a header value", request(Array("/v1/queues".utf8), headers: Array("X-Bad: a".utf8) + [0x00] + Array("b\r\n".utf8))),
                ("0xFF in a header name", request(Array("/v1/queues".utf8), headers: [0xFF] + Array(": x\r\n".utf8))),
                (
                    "0xFF in an Idempotency-Key",
                    request(
                        Array("/v1/queues".utf8), headers: Array("Idempotency-Key: ".utf8) + [0xFF, 0xC3] + Array("\r\n".utf8),
                        body: Array(#"{"name":"ik"}"#.utf8), method: "POST")
                ),
                ("0xFF in If-None-Match", request(Array("/v1/queues/u".utf8), headers: Array("If-None-Match: \"".utf8) + [0xFF] + Array("\"\r\n".utf8))),
                ("0xFF in Last-Event-ID", request(Array("/v1/events/stream".utf8), headers: Array("Last-Event-ID: ".utf8) + [0xFF] + Array("\r\n".utf8))),
                ("0xFF in a JSON string", request(Array("/v1/queues".utf8), body: Array(#"{"name":""#.utf8) + [0xFF] + Array(#""}"#.utf8), method: "POST")),
                (
                    "0xFF as a JSON key",
                    request(
                        Array("/v1/queues/u/operations".utf8), body: Array(#"{""#.utf8) + [0xFF] + Array(#"":1,"kind":"delay","spec":{"seconds":1}}"#.utf8),
                        method: "POST")
                ),
                ("NUL in a JSON string", request(Array("/v1/queues".utf8), body: Array(#"{"name":"a"#.utf8) + [0x00] + Array(#"b"}"#.utf8), method: "POST")),
                (
                    "\\u0000 in a name",
                    request(
                        Array("/v1/queues/u/operations".utf8), body: Array(#"{"kind":"delay","name":"a\u0000b","spec":{"seconds":1}}"#.utf8), method: "POST")
                ),
                (
                    "a lone surrogate escape",
                    request(Array("/v1/queues/u/operations".utf8), body: Array(#"{"kind":"delay","name":"\ud800","spec":{"seconds":1}}"#.utf8), method: "POST")
                ),
                ("a UTF-16 BOM body", request(Array("/v1/queues".utf8), body: [0xFE, 0xFF, 0x00, 0x7B, 0x00, 0x7D], method: "POST")),
                ("a body of NULs", request(Array("/v1/queues".utf8), body: [UInt8](repeating: 0, count: 64), method: "POST")),
                (
                    "deeply nested JSON",
                    request(
                        Array("/v1/queues/u/operations".utf8),
                        body: Array((String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)).utf8), method: "POST")
                ),
                (
                    "deeply nested spec",
                    request(
                        Array("/v1/queues/u/operations".utf8),
                        body: Array(
                            (#"{"kind":"delay","spec":"# + String(repeating: #"{"a":"#, count: 50_000) + "1" + String(repeating: "}", count: 50_001)).utf8),
                        method: "POST")
                ),
                (
                    "huge numbers",
                    request(
                        Array("/v1/queues/u/operations".utf8),
                        body: Array(
                            #"{"kind":"delay","spec":{"seconds":1e400},"timeout":-1e400,"retry":{"maxAttempts":1e30,"backoff":1e308,"multiplier":1e308}}"#.utf8),
                        method: "POST")
                ),
                (
                    "a delay of 1e18 seconds",
                    request(Array("/v1/queues/u/operations".utf8), body: Array(#"{"kind":"delay","spec":{"seconds":1e18}}"#.utf8), method: "POST")
                ),
                (
                    "maxConcurrentOperationCount 2^63",
                    request(Array("/v1/queues/u".utf8), body: Array(#"{"maxConcurrentOperationCount":9223372036854775808}"#.utf8), method: "PATCH")
                ),
                ("limit 2^64", request(Array("/v1/queues/u/operations?limit=18446744073709551616&after=99999999999999999999".utf8))),
                ("wait 1e308", request(Array("/v1/queues/u/wait?timeout=1e308".utf8))),
                ("wait NaN", request(Array("/v1/events?after=0&wait=nan".utf8))),
                ("wait -inf", request(Array("/v1/operations/x/wait?timeout=-inf".utf8))),
                ("claim max 2^63", request(Array("/v1/queues/u/claim?wait=0&max=9223372036854775807".utf8), method: "POST")),
                (
                    "notBefore year 99999",
                    request(
                        Array("/v1/queues/u/operations".utf8), body: Array(#"{"kind":"delay","spec":{"seconds":1},"notBefore":"99999-01-01T00:00:00Z"}"#.utf8),
                        method: "POST")
                ),
            ]
            for (what, bytes) in cases {
                switch server.raw(bytes, timeout: 5) {
                case let .success(r):
                    #expect(r.status < 500, "\(what): \(r.status) \(r.text.prefix(200))")
                    if r.status == 201, !what.contains("Idempotency-Key") {
                        #expect(what.contains("0xFF") == false && what.contains("NUL") == false, "\(what) was accepted: \(r.text.prefix(200))")
                    }
                case .failure:
                    break  // a connection closed on garbage is a refusal too
                }
                server.expectAlive(what)
            }
        }
    }

    @Test("very long paths, query strings and path segments are refused with 4xx and kill nothing")
    func veryLongTargets() async throws {
        let server = try Opqd()
        try await blocking {
            for (what, target) in [
                ("an 8 KiB queue name", "/v1/queues/" + String(repeating: "q", count: 8 << 10)),
                ("a 15 KiB path of slashes", "/" + String(repeating: "/", count: 15 << 10)),
                ("15 KiB of ../", "/v1/" + String(repeating: "../", count: 5 << 10)),
                ("a 15 KiB query", "/v1/events?" + String(repeating: "a=1&", count: (15 << 10) / 4)),
                ("a 100 KiB query", "/v1/events?after=" + String(repeating: "9", count: 100 << 10)),
                ("10k percent escapes", "/v1/queues/" + String(repeating: "%41", count: 4000)),
                ("a 1 MiB path", "/v1/queues/" + String(repeating: "x", count: 1 << 20)),
            ] {
                switch server.raw("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout: 5) {
                case let .success(r): #expect((400..<500).contains(r.status), "\(what): \(r.status)")
                case .failure: break
                }
                server.expectAlive(what)
            }
        }
    }
}
