import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The `http` kind against a hostile local target: redirect tricks, endless bodies, garbage
/// answers. Every failure is an `error.type` (plan8.md), never a trap.
@Suite("Hostile targets of the http kind")
struct HostileTargetTests {
    static let errorTypes: Set<String> = [
        "http-status", "timeout", "connection-refused", "dns", "tls", "network",
        "too-many-redirects", "redirect-refused", "invalid-response", "cancelled",
    ]

    /// Creates an http operation for `url` on queue `t`; returns its id.
    static func create(_ server: Opqd, _ url: String, timeout: Double = 5) throws -> String {
        let body = #"{"kind":"http","spec":{"method":"GET","url":\#(jsonString(url))},"timeout":\#(timeout),"retry":{"maxAttempts":1}}"#
        return try server.request("POST", "/v1/queues/t/operations", json: body).expecting(201, "creating an http operation for \(url)").string("id") ?? ""
    }

    /// Waits for every operation to finish (or `timeout`); returns their last statuses.
    static func finish(_ server: Opqd, _ ids: [String], timeout: Double) throws -> [String: TestResponse] {
        var last: [String: TestResponse] = [:]
        _ = try waitUntil(timeout: timeout, every: 0.1) {
            guard server.isAlive().0 else { return true }
            for id in ids where last[id]?.string("state") != "finished" {
                last[id] = try server.request("GET", "/v1/operations/\(id)")
            }
            return ids.allSatisfy { last[$0]?.string("state") == "finished" }
        }
        return last
    }

    /// Every answer is to reach its operation here: a breaker that opens on the target (they
    /// all send to one) would hold the later ones (that is HostEndpointTests' subject).
    static let noBreaker = ["--breaker-failures", "1000000"]

    static func errorType(_ r: TestResponse?) -> String? { (r?.object["error"] as? [String: Any])?["type"] as? String }

    @Test(
        "redirects to //[::1]/, ftp://, file:///etc/passwd, javascript: and broken URLs fail cleanly with redirect-refused or a network error; a 301 loop fails too-many-redirects"
    )
    func redirectTricks() async throws {
        let redirects: [String: String] = [
            "/ipv6-authority": "//[::1]/",
            "/ipv6-bad": "//[::1/",
            "/ftp": "ftp://127.0.0.1/x",
            "/file": "file:///etc/passwd",
            "/js": "javascript:alert(1)",
            "/data": "data:text/plain,hi",
            "/gopher": "gopher://127.0.0.1:70/",
            "/empty": "",
            "/bracket": "http://[",
            "/port": "http://127.0.0.1:99999/",
            "/userinfo": "http://user:pass@127.0.0.1:9/",
            "/space": "http://127.0.0.1/a b",
            "/utf8": "http://\u{00e9}\u{0301}.invalid/",
            "/long": "http://127.0.0.1/" + String(repeating: "a", count: 6000),
        ]
        let target = try HostileTarget { path in
            if path.hasPrefix("/loop") {
                return .raw("HTTP/1.1 301 Moved Permanently\r\nLocation: /loop\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
            if path == "/relative" { return .raw("HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n") }
            if path == "/ok" { return .raw("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok") }
            if let location = redirects[path] {
                return .raw("HTTP/1.1 302 Found\r\nLocation: \(location)\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
            return .raw("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        }
        let server = try Opqd(Self.noBreaker)
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"t","maxConcurrentOperationCount":32}"#).expecting(201)
            var ids: [String: String] = [:]
            for path in redirects.keys.sorted() + ["/loop", "/relative"] { ids[path] = try Self.create(server, target.url(path)) }
            // A limit to give up at (each operation has a 5 s timeout and the targets answer at once).
            let last = try Self.finish(server, Array(ids.values), timeout: 60)
            server.expectAlive("the redirect tricks")
            for (path, id) in ids.sorted(by: { $0.key < $1.key }) {
                let r = last[id]
                guard r?.string("state") == "finished" else {
                    Issue.record("\(path): not finished within 60 s: \(r?.text.prefix(300) ?? "no answer")")
                    continue
                }
                let type = Self.errorType(r)
                let text = r?.text ?? ""
                #expect(text.contains("root:x:0") == false, "\(path): /etc/passwd leaked into the result")
                switch path {
                case "/relative":
                    #expect(r?.string("outcome") == "succeeded", "a relative redirect to /ok: \(text.prefix(300))")
                case "/loop":
                    #expect(type == "too-many-redirects", "a 301 loop: \(text.prefix(300))")
                    let hops = target.requests.filter { $0.contains("/loop") }.count
                    #expect(hops <= 6, "a 301 loop was followed \(hops) times (at most 5 redirects)")
                case "/ftp", "/file", "/js", "/data", "/gopher":
                    #expect(r?.string("outcome") == "failed" && type == "redirect-refused", "\(path) -> \(redirects[path] ?? ""): \(text.prefix(300))")
                default:
                    #expect(
                        r?.string("outcome") == "failed" && type.map(Self.errorTypes.contains) == true,
                        "\(path) -> \(redirects[path]?.prefix(60) ?? ""): \(text.prefix(300))")
                }
            }
        }
    }

    @Test("an internationalized host name goes out as its A-label (bücher.invalid as xn--bcher-kva.invalid), not refused as invalid-spec")
    func internationalizedHost() async throws {
        // The target is the server's proxy: the name needs no resolver here, and the request
        // line shows it as libcurl sent it. In the C locale libcurl cannot convert the name and
        // the operation failed with invalid-spec before the server set a UTF-8 LC_CTYPE.
        let target = try HostileTarget { _ in .raw("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok") }
        let server = try Opqd(Self.noBreaker, environment: ["http_proxy": target.url("/"), "no_proxy": "", "NO_PROXY": ""])
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"t"}"#).expecting(201)
            let id = try Self.create(server, "http://b\u{00FC}cher.invalid/idn")
            let last = try Self.finish(server, [id], timeout: 15)
            let text = last[id]?.text.prefix(400) ?? "no answer"
            #expect(last[id]?.string("outcome") == "succeeded", "http://bücher.invalid/idn through the proxy: \(text)")
            #expect(target.requests.contains("GET http://xn--bcher-kva.invalid/idn"), "the proxy saw \(target.requests)")
            server.expectAlive("an internationalized host")
        }
    }

    @Test("an endless body (fast or slow) ends in a timeout or a truncated body, with the process alive and its memory bounded")
    func endlessBodies() async throws {
        // The targets go on for 90 s (they stop sooner when the server goes away): an operation
        // that finishes within the 45 s limit below was ended by its 3 s timeout or the body cap,
        // never by the target giving up.
        let target = try HostileTarget { path in
            switch path {
            case "/fast":
                return .endless(head: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n", piece: 65536, interval: 0, seconds: 90)
            case "/fast-chunked":
                return .endless(head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000\r\n", piece: 65536, interval: 0, seconds: 90)
            case "/declared": return .endless(head: "HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n", piece: 65536, interval: 0, seconds: 90)
            case "/slow": return .endless(head: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", piece: 1, interval: 0.1, seconds: 90)
            case "/slow-head": return .endless(head: "HTTP/1.1 200 OK\r\nX-Slow: ", piece: 1, interval: 0.1, seconds: 90)
            case "/endless-head": return .endless(head: "HTTP/1.1 200 OK\r\n", piece: 65536, interval: 0, seconds: 90)
            default: return .hang(seconds: 90)
            }
        }
        let server = try Opqd(Self.noBreaker)
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"t","maxConcurrentOperationCount":16}"#).expecting(201)
            let before = server.memory()
            let started = Date()
            var ids: [String: String] = [:]
            for path in ["/fast", "/fast-chunked", "/declared", "/slow", "/slow-head", "/endless-head", "/hang"] {
                ids[path] = try Self.create(server, target.url(path), timeout: 3)
            }
            var peak = before.rss
            let last = try Self.finish(server, Array(ids.values), timeout: 45)
            peak = max(peak, server.memory().hwm)
            let after = server.memory()
            print(
                "Memory endless bodies: \(target.bytesSent / (1 << 20)) MiB sent by the target in \(String(format: "%.1f", Date().timeIntervalSince(started))) s; "
                    + "VmRSS \(before.rss / 1024) -> \(after.rss / 1024) MiB, VmHWM \(after.hwm / 1024) MiB")
            server.expectAlive("endless bodies")
            for (path, id) in ids.sorted(by: { $0.key < $1.key }) {
                let r = last[id]
                #expect(r?.string("state") == "finished", "\(path): not finished within 45 s with a 3 s timeout: \(r?.text.prefix(300) ?? "no answer")")
                if r?.string("outcome") == "failed" {
                    #expect(Self.errorType(r).map(Self.errorTypes.contains) == true, "\(path): error \(r?.text.prefix(300) ?? "")")
                }
                #expect((r?.body.count ?? 0) < 1 << 20, "\(path): a status of \(r?.body.count ?? 0) bytes (the body should be size-capped)")
            }
            #expect(after.hwm - before.rss < 128 << 10, "endless bodies raised VmHWM by \((after.hwm - before.rss) / 1024) MiB")
            #expect(after.rss - before.rss < 96 << 10, "endless bodies left VmRSS \((after.rss - before.rss) / 1024) MiB higher")
        }
    }

    @Test("garbage status lines, broken lengths and empty answers fail with invalid-response or a network error, never a crash")
    func garbageAnswers() async throws {
        let answers: [String: String] = [
            "/garbage": "garbage\r\n\r\n",
            "/letters": "HTTP/1.1 abc Nonsense\r\n\r\n",
            "/huge-status": "HTTP/1.1 99999999999999999999 Big\r\nContent-Length: 0\r\n\r\n",
            "/negative-status": "HTTP/1.1 -200 Neg\r\nContent-Length: 0\r\n\r\n",
            "/status-0": "HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n",
            "/status-1xx-only": "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching\r\n\r\n",
            "/http2": "HTTP/2 200\r\n\r\n",
            "/http09": "hello world",
            "/nul": "HTTP/1.1 200 OK\r\nX-A: \u{0}\u{0}\r\nContent-Length: 2\r\n\r\nok",
            "/negative-length": "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nabc",
            "/overflow-length": "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nabc",
            "/two-lengths": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nabcde",
            "/overflow-chunk": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
            "/bad-chunk": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            "/short": "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc",
            "/empty": "",
            "/utf8-reason": "HTTP/1.1 200 \u{00e9}\u{0301}\u{fffd}\r\nContent-Length: 2\r\n\r\nok",
            "/bad-utf8-body": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\n\"\u{00ff}\"",
            "/huge-header": "HTTP/1.1 200 OK\r\nX-Big: " + String(repeating: "b", count: 1 << 20) + "\r\nContent-Length: 2\r\n\r\nok",
            "/many-headers": "HTTP/1.1 200 OK\r\n" + (0..<20000).map { "X-\($0): v\r\n" }.joined() + "Content-Length: 2\r\n\r\nok",
            "/gzip-bomb-header": "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
            "/location-no-3xx": "HTTP/1.1 200 OK\r\nLocation: file:///etc/passwd\r\nContent-Length: 2\r\n\r\nok",
            "/redirect-no-location": "HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n",
            "/redirect-two-locations": "HTTP/1.1 302 Found\r\nLocation: /ok\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\n\r\n",
        ]
        let target = try HostileTarget { path in
            if path == "/ok" { return .raw("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok") }
            return .raw(answers[path] ?? "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        }
        let server = try Opqd(Self.noBreaker)
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"t","maxConcurrentOperationCount":32}"#).expecting(201)
            var ids: [String: String] = [:]
            for path in answers.keys.sorted() { ids[path] = try Self.create(server, target.url(path), timeout: 3) }
            // A limit to give up at (each operation has a 3 s timeout and the target answers at once).
            let last = try Self.finish(server, Array(ids.values), timeout: 60)
            server.expectAlive("garbage answers")
            for (path, id) in ids.sorted(by: { $0.key < $1.key }) {
                let r = last[id]
                guard r?.string("state") == "finished" else {
                    Issue.record("\(path): not finished within 60 s: \(r?.text.prefix(300) ?? "no answer")")
                    continue
                }
                let text = r?.text ?? ""
                #expect(text.contains("root:x:0") == false, "\(path): /etc/passwd leaked")
                if r?.string("outcome") == "failed" {
                    #expect(Self.errorType(r).map(Self.errorTypes.contains) == true, "\(path): error \(r?.text.prefix(300) ?? "")")
                }
                if ["/garbage", "/letters", "/huge-status", "/negative-status", "/http09"].contains(path) {
                    #expect(
                        r?.string("outcome") == "failed" && ["invalid-response", "network"].contains(Self.errorType(r) ?? ""),
                        "\(path): \(r?.text.prefix(300) ?? "")")
                }
            }
        }
    }
}
