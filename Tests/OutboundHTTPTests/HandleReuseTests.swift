import Dispatch
import Locking
import Testing

@testable import OutboundHTTP

#if canImport(Glibc)
import Glibc
#endif

/// The client keeps libcurl easy handles for the next requests (`EasyHandlePool`): nothing one
/// request sets may reach the next one that gets its handle, keep-alive must still work, and the
/// handles must be bounded and freed with the client.
@Suite struct HandleReuseTests {
    /// Echoes what it got in header fields; `/first` adds a field of its own, `/slow` answers after a second.
    static let echo: KeepAliveTarget.Answer = { request in
        if request.pathWithoutQuery == "/slow" { usleep(1_000_000) }
        var headers = [
            ("X-Method", request.method), ("X-Body", String(decoding: request.body, as: UTF8.self)),
            ("X-Leak", request.headers["x-leak"] ?? "none"),
        ]
        if request.pathWithoutQuery == "/first" { headers.append(("X-First", "1")) }
        return (200, headers, "body of \(request.path)")
    }

    @Test func nothingOneRequestSetsReachesTheNextOnTheSameHandle() throws {
        let target = try KeepAliveTarget(Self.echo)
        defer { target.stop() }
        let client = OutboundHTTPClient()
        let base = target.base
        func send(_ method: String, _ path: String, headers: [(String, String)] = [], body: String? = nil, pathAsIs: Bool = false) throws -> OutboundResponse {
            let request = OutboundRequest(method: method, url: base + path, headers: headers, body: body.map { Array($0.utf8) }, pathAsIs: pathAsIs)
            let result = try #require(exchange(client, request))
            return try #require(result.response, "\(method) \(path): \(result)")
        }
        /// What the target saw of the last request.
        func last() throws -> ReceivedRequest { try #require(target.requests.last?.request) }
        func field(_ response: OutboundResponse, _ name: String) -> String? { response.headers.first { $0.0 == name }?.1 }

        // NOBODY of a HEAD: the GET after it still reads its body.
        let head = try send("HEAD", "/echo")
        #expect(head.status == 200 && head.body.isEmpty && head.contentLength == 13)
        let afterHead = try send("GET", "/echo")
        let getAfterHead = try last()
        #expect(afterHead.body == Array("body of /echo".utf8) && getAfterHead.method == "GET")

        // A POST's body, its fields and its method: the GET after it has none of them.
        _ = try send("POST", "/echo", headers: [("X-Leak", "1"), ("Content-Type", "text/plain")], body: "data")
        let post = try last()
        #expect(post.method == "POST" && post.body == Array("data".utf8) && post.headers["x-leak"] == "1")
        _ = try send("GET", "/echo")
        let get = try last()
        #expect(get.method == "GET" && get.body.isEmpty, "\(get.headers)")
        #expect(get.headers["x-leak"] == nil && get.headers["content-type"] == nil && get.headers["content-length"] == nil, "\(get.headers)")

        // CUSTOMREQUEST: a PUT, then a POST (which sets no custom method of its own), then a DELETE, then a GET.
        _ = try send("PUT", "/echo", body: "put")
        #expect(try last().method == "PUT")
        _ = try send("POST", "/echo", body: "post")
        #expect(try last().method == "POST")
        _ = try send("DELETE", "/echo")
        #expect(try last().method == "DELETE")
        _ = try send("GET", "/echo")
        #expect(try last().method == "GET")

        // PATH_AS_IS: the path as given, then dot segments resolved again.
        _ = try send("GET", "/x/../echo", pathAsIs: true)
        #expect(try last().path == "/x/../echo")
        _ = try send("GET", "/x/../echo")
        #expect(try last().path == "/echo")

        // The header block of one answer is not part of the next.
        #expect(field(try send("GET", "/first"), "X-First") == "1")
        #expect(field(try send("GET", "/echo"), "X-First") == nil)

        #expect(target.requests.allSatisfy { $0.request.headers["expect"] == nil && $0.request.headers["user-agent"] == "opqd" })
        // One handle and one kept-alive connection did it all.
        #expect(target.connections == 1 && target.requests.allSatisfy { $0.connection == 1 })
        #expect(waitUntil { client.loop.liveHandleCount == 1 }, "\(client.loop.liveHandleCount) handles")

        // A timeout does not outlive its request; the timed-out handle is not kept.
        let timedOut = try #require(exchange(client, OutboundRequest(method: "GET", url: base + "/slow", timeout: 0.3)))
        #expect(timedOut.error?.type == "timeout", "\(timedOut)")
        let patient = try #require(exchange(client, OutboundRequest(method: "GET", url: base + "/slow", timeout: 10)))
        #expect(patient.response?.status == 200, "\(patient)")
        // A failed connection neither: the next request is answered.
        let refused = try #require(exchange(client, OutboundRequest(method: "GET", url: "http://127.0.0.1:\(closedPort())/")))
        #expect(refused.error?.type == "connection-refused", "\(refused)")
        #expect(try send("GET", "/echo").status == 200)
        #expect(waitUntil { client.loop.liveHandleCount == 1 }, "\(client.loop.liveHandleCount) handles")
    }

    @Test func idleHandlesAreBoundedAndFreedWithTheClient() throws {
        let target = try KeepAliveTarget(Self.echo)
        defer { target.stop() }
        let count = EasyHandlePool.capacity + 36
        var loop: CurlLoop?
        do {
            let client = OutboundHTTPClient()
            loop = client.loop
            let done = Lock(0)
            for _ in 0..<count {
                client.send(OutboundRequest(method: "GET", url: target.base + "/slow", timeout: 20)) { result in
                    if result.response?.status == 200 { done.withLock { $0 += 1 } }
                }
            }
            #expect(waitUntil(timeout: 20) { done.value == count }, "\(done.value) of \(count) answered")
            // All of them were in flight at once; the pool keeps only its capacity.
            #expect(waitUntil { client.loop.liveHandleCount == EasyHandlePool.capacity }, "\(client.loop.liveHandleCount) handles")
        }
        let ended = try #require(loop)
        #expect(waitUntil { ended.liveHandleCount == 0 }, "\(ended.liveHandleCount) handles after the client went")
    }
}
