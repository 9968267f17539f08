import Dispatch
import Foundation
import Locking
import OutboundHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Sends `request` and waits for the completion (at most `wait` seconds).
func exchange(_ client: OutboundHTTPClient, _ request: OutboundRequest, wait: Double = 10) -> Result<OutboundResponse, OutboundError>? {
    let box = Lock<Result<OutboundResponse, OutboundError>?>(nil)
    let done = DispatchSemaphore(value: 0)
    client.send(request) { result in
        box.withLock { $0 = result }
        done.signal()
    }
    guard done.wait(timeout: .now() + wait) == .success else { return nil }
    return box.value
}

extension Result {
    var response: Success? { if case let .success(s) = self { return s }; return nil }
    var error: Failure? { if case let .failure(f) = self { return f }; return nil }
}

/// The client against a local target that misbehaves on purpose.
@Suite(.serialized) struct OutboundClientTests {
    let client = OutboundHTTPClient()

    @Test func plainAnswer() throws {
        let server = try HostileServer(["/ok": { _, out in out.write(reply(200, [("X-A", "b")], body: "hello")) }])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/ok")))
        let response = try #require(r.response, "\(r)")
        #expect(response.status == 200)
        #expect(response.body == Array("hello".utf8))
        #expect(response.headers.contains { $0.0 == "X-A" && $0.1 == "b" })
        #expect(response.size == 5 && !response.truncated && response.contentLength == 5 && response.redirects == 0)
    }

    @Test func redirectToSchemeRelativeIPv6DoesNotCrash() throws {
        let server = try HostileServer(["/v6": { _, out in out.write(reply(302, [("Location", "//[::1]/")])) }])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/v6", timeout: 3)))
        // Followed to http://[::1]/ (port 80, nothing there): a clean error, or an answer.
        if let e = r.error { #expect(["connection-refused", "network", "timeout"].contains(e.type), "\(e)") }
        print("302 to //[::1]/: \(r)")
    }

    @Test func redirectLoopStopsAfterFive() throws {
        let server = try HostileServer(["/loop": { _, out in out.write(reply(301, [("Location", "/loop")])) }])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/loop")))
        #expect(r.error?.type == "too-many-redirects")
        #expect(server.requests.count == 6)
    }

    @Test func redirectsToOtherSchemesAreRefused() throws {
        for target in ["ftp://127.0.0.1/x", "file:///etc/passwd", "gopher://127.0.0.1/", "javascript:alert(1)", "http://", "http:// x/"] {
            let server = try HostileServer(["/r": { _, out in out.write(reply(302, [("Location", target)])) }])
            let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/r")))
            #expect(r.error?.type == "redirect-refused", "\(target): \(r)")
            #expect(server.requests.count == 1)
            server.stop()
        }
    }

    @Test func relativeLocationResolvesAgainstTheCurrentURL() throws {
        let server = try HostileServer([
            "/a/b": { _, out in out.write(reply(302, [("Location", "../ok?x=1")])) },
            "/ok": { _, out in out.write(reply(200, body: "fine")) },
        ])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/a/b")))
        let response = try #require(r.response, "\(r)")
        #expect(response.body == Array("fine".utf8))
        #expect(response.redirects == 1 && response.finalURL == "\(server.base)/ok?x=1")
        #expect(server.requests.map(\.path) == ["/a/b", "/ok?x=1"])
    }

    @Test func redirectWithoutLocationIsTheAnswer() throws {
        let server = try HostileServer(["/r": { _, out in out.write(reply(302, body: "nowhere")) }])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/r")))
        #expect(r.response?.status == 302 && r.response?.body == Array("nowhere".utf8))
    }

    @Test func redirectIsTheAnswerWhenNotFollowing() throws {
        let server = try HostileServer(["/r": { _, out in out.write(reply(307, [("Location", "/elsewhere")], body: "moved")) }])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "POST", url: "\(server.base)/r", body: [1], followRedirects: false)))
        let response = try #require(r.response, "\(r)")
        #expect(response.status == 307 && response.body == Array("moved".utf8) && response.redirects == 0)
        #expect(response.headers.contains { $0.0 == "Location" && $0.1 == "/elsewhere" })
        #expect(server.requests.count == 1)
    }

    static let echo: HostileServer.Route = { request, out in
        out.write(
            reply(
                200, [("X-Method", request.method), ("X-Auth", request.headers["authorization"] ?? "none")],
                body: String(decoding: request.body, as: UTF8.self)))
    }

    @Test func seeOtherTurnsPostIntoGet() throws {
        let server = try HostileServer(["/post": { _, out in out.write(reply(303, [("Location", "/echo")])) }, "/echo": Self.echo])
        defer { server.stop() }
        let r = try #require(
            exchange(
                client,
                OutboundRequest(
                    method: "POST", url: "\(server.base)/post",
                    headers: [("Content-Type", "text/plain")], body: Array("data".utf8))))
        let response = try #require(r.response, "\(r)")
        #expect(response.headers.first { $0.0 == "X-Method" }?.1 == "GET")
        #expect(response.body.isEmpty)
        #expect(server.requests.last?.headers["content-type"] == nil)
    }

    @Test func temporaryRedirectKeepsMethodAndBody() throws {
        let server = try HostileServer(["/put": { _, out in out.write(reply(307, [("Location", "/echo")])) }, "/echo": Self.echo])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "PUT", url: "\(server.base)/put", body: Array("data".utf8))))
        let response = try #require(r.response, "\(r)")
        #expect(response.headers.first { $0.0 == "X-Method" }?.1 == "PUT")
        #expect(response.body == Array("data".utf8))
    }

    @Test func credentialsAreDroppedWhenTheOriginChanges() throws {
        let other = try HostileServer(["/echo": Self.echo])
        defer { other.stop() }
        let server = try HostileServer([
            "/same": { _, out in out.write(reply(302, [("Location", "/echo")])) },
            "/cross": { _, out in out.write(reply(302, [("Location", "\(other.base)/echo")])) },
            "/echo": Self.echo,
        ])
        defer { server.stop() }
        let auth = [("Authorization", "Bearer s3cret"), ("Cookie", "a=b")]
        let same = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/same", headers: auth)))
        #expect(same.response?.headers.first { $0.0 == "X-Auth" }?.1 == "Bearer s3cret")
        let cross = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/cross", headers: auth)))
        #expect(cross.response?.headers.first { $0.0 == "X-Auth" }?.1 == "none")
        #expect(other.requests.first?.headers["cookie"] == nil)
    }

    @Test func headerFieldsGoOutAsGiven() throws {
        let server = try HostileServer(["/echo": Self.echo])
        defer { server.stop() }
        let fields = [("X-Empty", ""), ("X-Inner", "a  b"), ("X-Utf8", "é ü"), ("x-lower", "1")]
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/echo", headers: fields)))
        #expect(r.response?.status == 200, "\(r)")
        let seen = try #require(server.requests.last).headers
        for (name, value) in fields { #expect(seen.values(name) == [value], "\(name): \(seen)") }
        #expect(seen["expect"] == nil)
        // The caller's own Expect goes out instead of none.
        _ = try #require(exchange(client, OutboundRequest(method: "POST", url: "\(server.base)/echo", headers: [("EXPECT", "x-custom")], body: [1])))
        #expect(try #require(server.requests.last).headers["expect"] == "x-custom")
    }

    static let endless: HostileServer.Route = { _, out in
        guard out.write("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n") else { return }
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1024)
        while out.write(chunk) { usleep(1000) }
    }

    @Test func slowEndlessBodyEndsAtTheCapOrTheTimeout() throws {
        let server = try HostileServer(["/endless": Self.endless])
        defer { server.stop() }
        let t0 = now()
        let capped = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/endless", timeout: 10, maxResponseBytes: 16 * 1024)))
        let response = try #require(capped.response, "\(capped)")
        #expect(response.truncated && response.body.count == 16 * 1024 && response.size <= 17 * 1024)
        print("endless body, 16 KiB cap: \(String(format: "%.0f", (now() - t0) * 1000)) ms")
        let t1 = now()
        let timed = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/endless", timeout: 0.5, maxResponseBytes: 64 << 20)))
        let took = now() - t1
        #expect(timed.error?.type == "timeout", "\(timed)")
        #expect(took >= 0.45 && took < 2, "took \(took) s")
    }

    @Test func hugeHeadersAreRefused() throws {
        let many = String(repeating: "X-Filler: \(String(repeating: "a", count: 100))\r\n", count: 1000)
        let long = "X-Long: \(String(repeating: "b", count: 300_000))\r\n"
        let server = try HostileServer([
            "/many": { _, out in out.write("HTTP/1.1 200 OK\r\nConnection: close\r\n\(many)Content-Length: 0\r\n\r\n") },
            "/long": { _, out in out.write("HTTP/1.1 200 OK\r\nConnection: close\r\n\(long)Content-Length: 0\r\n\r\n") },
        ])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/many", maxHeaderBytes: 16 * 1024)))
        #expect(r.error?.type == "invalid-response", "\(r)")
        let l = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/long")))
        #expect(l.error?.type == "invalid-response", "\(l)")
    }

    @Test func invalidUTF8HeaderValuesAreDecodedLossily() throws {
        let server = try HostileServer([
            "/bad": { _, out in
                out.write(
                    Array("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\nX-Bad: a".utf8) + [0xFF, 0xFE, 0xC3]
                        + Array("z\r\n\u{00}X: y\r\n\r\n".utf8))
            }
        ])
        defer { server.stop() }
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/bad")))
        let value = r.response?.headers.first { $0.0 == "X-Bad" }?.1
        #expect(value?.hasPrefix("a\u{FFFD}") == true, "\(r)")
    }

    @Test func garbageStatusLinesAreErrors() throws {
        for garbage in [
            "FOO BAR\r\n\r\n", "HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n", "\u{16}\u{03}\u{01}\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        ] {
            let server = try HostileServer(["/g": { _, out in out.write(garbage) }])
            let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/g", timeout: 5)))
            #expect(["invalid-response", "network"].contains(r.error?.type ?? "success"), "\(garbage.debugDescription): \(r)")
            server.stop()
        }
    }

    @Test func connectionRefusedAndInvalidURLs() throws {
        let refused = try #require(exchange(client, OutboundRequest(method: "GET", url: "http://127.0.0.1:\(closedPort())/")))
        #expect(refused.error?.type == "connection-refused", "\(refused)")
        for bad in ["ftp://x/", "/relative", "http://", "", "http://x/\u{0}", "http://x/" + String(repeating: "a", count: 9000)] {
            let r = try #require(exchange(client, OutboundRequest(method: "GET", url: bad)))
            #expect(r.error?.type == "invalid-url", "\(bad.prefix(30)): \(r)")
        }
        let header = try #require(exchange(client, OutboundRequest(method: "GET", url: "http://127.0.0.1:1/", headers: [("X", "a\r\nb")])))
        #expect(header.error?.type == "invalid-url")
    }

    @Test func cancelAbortsPromptly() throws {
        let closed = Lock<Double?>(nil)
        let server = try HostileServer([
            "/hang": { _, out in
                // Waits for the client to close the connection, and notes when it did.
                var byte: UInt8 = 0
                var pfd = pollfd(fd: out.fd, events: Int16(POLLIN), revents: 0)
                while !out.server.isStopping {
                    if poll(&pfd, 1, 5) > 0 { if recv(out.fd, &byte, 1, Int32(MSG_DONTWAIT)) <= 0 { break } }
                }
                closed.withLock { $0 = now() }
            }
        ])
        defer { server.stop() }
        let ended = Lock<(Double, OutboundError?)?>(nil)
        let task = client.send(OutboundRequest(method: "GET", url: "\(server.base)/hang")) { r in ended.withLock { $0 = (now(), r.error) } }
        let deadline = now() + 5
        while server.requests.isEmpty && now() < deadline { usleep(1000) }
        let t0 = now()
        task.cancel()
        let returned = now()
        let completion = try #require(ended.value)
        #expect(completion.1?.type == "cancelled")
        while closed.value == nil && now() < deadline + 2 { usleep(200) }
        let close = try #require(closed.value)
        print(
            String(
                format: "outbound cancel: completion after %.3f ms, cancel() returned after %.3f ms, connection closed after %.2f ms",
                (completion.0 - t0) * 1000, (returned - t0) * 1000, (close - t0) * 1000))
        #expect(close - t0 < 0.1)
        task.cancel()  // again: nothing
    }

    @Test func everyCompletionIsCalledExactlyOnce() throws {
        let server = try HostileServer([
            "/ok": { _, out in
                usleep(UInt32.random(in: 0...3000)); out.write(reply(200, body: "x"))
            }
        ])
        defer { server.stop() }
        let calls = Lock<[Int: Int]>([:])
        var tasks: [OutboundTask] = []
        for i in 0..<200 {
            tasks.append(client.send(OutboundRequest(method: "GET", url: "\(server.base)/ok", timeout: 5)) { _ in calls.withLock { $0[i, default: 0] += 1 } })
            if i % 3 == 0 { tasks[i / 2].cancel() }
        }
        for (i, t) in tasks.enumerated() where i % 5 == 0 { t.cancel() }
        let deadline = now() + 10
        while calls.value.count < 200 && now() < deadline { usleep(1000) }
        usleep(100_000)
        #expect(calls.value.count == 200 && calls.value.values.allSatisfy { $0 == 1 })
    }

    @Test func timeoutCoversRedirects() throws {
        let server = try HostileServer([
            "/slow": { _, out in
                usleep(200_000); out.write(reply(302, [("Location", "/slow")]))
            }
        ])
        defer { server.stop() }
        let t0 = now()
        let r = try #require(exchange(client, OutboundRequest(method: "GET", url: "\(server.base)/slow", timeout: 0.5)))
        #expect(r.error?.type == "timeout", "\(r)")
        #expect(now() - t0 < 1.5)
    }

    @Test func clientShutdownCancelsWhatIsInFlight() throws {
        let server = try HostileServer(["/hang": { _, out in while !out.server.isStopping { usleep(5000) } }])
        defer { server.stop() }
        let done = DispatchSemaphore(value: 0)
        let type = Lock<String?>(nil)
        do {
            let own = OutboundHTTPClient()
            own.send(OutboundRequest(method: "GET", url: "\(server.base)/hang")) { r in
                type.withLock { $0 = r.error?.type }; done.signal()
            }
            usleep(50_000)
        }
        #expect(done.wait(timeout: .now() + 3) == .success)
        #expect(type.value == "cancelled")
    }
}
