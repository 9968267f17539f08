import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The three inputs issue 8 reports as killing the process, against the real binary.
@Suite("Known killers")
struct KillerTests {
    @Test("Last-Event-ID 18446744073709551615 on the event stream does not kill the server")
    func lastEventIDOverflow() async throws {
        let server = try Opqd()
        try await blocking {
            for value in [
                "18446744073709551615", "18446744073709551614", "9223372036854775807", "9223372036854775808",
                "-1", "1e3", "0x10", "99999999999999999999999999", " 5", "5 ", "",
            ] {
                let c = try RawConnection(port: server.port, timeout: 5)
                c.send("GET /v1/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nLast-Event-ID: \(value)\r\n\r\n")
                let (bytes, _) = c.readAvailable(milliseconds: 400)
                c.close()
                let text = String(decoding: bytes, as: UTF8.self)
                #expect(text.contains(" 500 ") == false, "Last-Event-ID \(value.debugDescription): \(text.prefix(300))")
                server.expectAlive("Last-Event-ID: \(value)")
            }
            // The same through the query.
            for value in ["18446744073709551615", "9223372036854775807", "-1"] {
                let c = try RawConnection(port: server.port, timeout: 5)
                c.send("GET /v1/events/stream?after=\(value) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                _ = c.readAvailable(milliseconds: 300)
                c.close()
                server.expectAlive("GET /v1/events/stream?after=\(value)")
                let feed = try server.request("GET", "/v1/events?after=\(value)")
                #expect(feed.status < 500, "GET /v1/events?after=\(value): \(feed)")
                server.expectAlive("GET /v1/events?after=\(value)")
            }
        }
    }

    @Test("an expectStatus with a combining character (\"1\\u0301xx\") is refused, not a crash, even without the queue")
    func combiningCharacterInExpectStatus() async throws {
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"real"}"#)
            for queue in ["any", "real"] {
                for pattern in [
                    #"1\u0301xx"#, "1\u{0301}xx", #"\u0661xx"#, "２xx", "9xx", "-1xx", "99999999999999999999", "2xxx", "", "xxx", #"2\u0000x"#, "۲۰۰",
                ] {
                    let body = #"{"kind":"http","spec":{"method":"GET","url":"http://127.0.0.1:9/","expectStatus":["\#(pattern)"]}}"#
                    let r = try server.request("POST", "/v1/queues/\(queue)/operations", json: body)
                    #expect((400..<500).contains(r.status), "expectStatus \(pattern.debugDescription) on queue \(queue): \(r)")
                    server.expectAlive("expectStatus \(pattern.debugDescription)")
                }
                // Numbers out of range, as numbers.
                for value in ["1e300", "-1", "18446744073709551616", "600", "99", "1.5"] {
                    let body = #"{"kind":"http","spec":{"method":"GET","url":"http://127.0.0.1:9/","expectStatus":[\#(value)]}}"#
                    let r = try server.request("POST", "/v1/queues/\(queue)/operations", json: body)
                    #expect(r.status < 500, "expectStatus [\(value)]: \(r)")
                    server.expectAlive("expectStatus [\(value)]")
                }
            }
        }
    }

    @Test("an http operation redirected to //[::1]/ finishes or fails cleanly and the server lives on")
    func redirectToBracketedIPv6AuthorityOnly() async throws {
        let target = try HostileTarget { _ in .raw("HTTP/1.1 302 Found\r\nLocation: //[::1]/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n") }
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"q"}"#).expecting(201)
            let op = try server.request(
                "POST", "/v1/queues/q/operations",
                json: #"{"kind":"http","spec":{"method":"GET","url":"\#(target.url("/start"))"},"timeout":5,"retry":{"maxAttempts":3,"backoff":0.1}}"#
            )
            .expecting(201, "creating the http operation")
            let id = op.string("id") ?? ""
            var last: TestResponse? = nil
            let finished = try waitUntil(timeout: 20, every: 0.1) {
                guard server.isAlive().0 else { return true }
                last = try server.request("GET", "/v1/operations/\(id)")
                return last?.string("state") == "finished"
            }
            server.expectAlive("the redirect to //[::1]/")
            #expect(finished && last?.string("state") == "finished", "the operation should finish within 20 s: \(last.map(\.description) ?? "no answer")")
            #expect(target.requests.isEmpty == false, "the target was never asked")
            // Restarting after an unclean stop must not run into the same trap.
            server.killNine()
            try server.restart()
            usleep(1_000_000)
            server.expectAlive("a restart after the redirect")
        }
    }
}
