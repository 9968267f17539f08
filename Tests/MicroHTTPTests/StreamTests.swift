import Dispatch
import Foundation
import Glibc
import Locking
import Synchronization
import Testing

@testable import MicroHTTP

@Suite("Streamed responses")
struct StreamTests {
    @Test("a stream that sends three chunks over time, then closes, is read in full")
    func threeChunks() throws {
        let closed = Atomic<Int>(0)
        try withServer(handler: { _ in
            .stream(status: 200, headers: [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")]) { stream in
                stream.onClose { closed.add(1, ordering: .relaxed) }
                stream.send(Array("data: 1\n\n".utf8))  // synchronously, before the first read
                DispatchQueue.global().async {
                    usleep(50_000)
                    stream.send(Array("data: 2\n\n".utf8))
                    usleep(50_000)
                    stream.send(Array("data: 3\n\n".utf8))
                    stream.close()
                    stream.send(Array("data: ignored\n\n".utf8))
                    stream.close()
                }
            }
        }) { server throws in
            let socket = try RawConnection(port: server.port)
            let response = try socket.request("GET", "/events")
            #expect(response.status == 200)
            #expect(response.headers["content-type"] == "text/event-stream")
            #expect(response.headers["transfer-encoding"] == "chunked")
            #expect(response.text == "data: 1\n\ndata: 2\n\ndata: 3\n\n")
            // The connection is still usable afterwards (chunked, keep-alive).
            #expect(try socket.request("GET", "/events").text == "data: 1\n\ndata: 2\n\ndata: 3\n\n")
            #expect(waitUntil { server.core.registry.withLock { $0.streams.isEmpty } })
        }
        // `close()` runs the callbacks after it releases the stream's lock, so the client can read
        // the end of the body (and the server stop) before the producer's thread gets to them: a
        // loaded 2-core machine showed 1 here. Both must run, soon.
        #expect(waitUntil { closed.load(ordering: .relaxed) == 2 })
    }

    @Test("curl reads an event stream")
    func curlReadsStream() throws {
        try withServer(handler: { _ in
            .stream(status: 200, headers: [("Content-Type", "text/event-stream")]) { stream in
                DispatchQueue.global().async {
                    for index in 1...3 {
                        stream.send(Array("data: \(index)\n\n".utf8))
                        usleep(10_000)
                    }
                    stream.close()
                }
            }
        }) { server throws in
            let result = try curl(["-N", "http://127.0.0.1:\(server.port)/events"])
            #expect(result.status == 200)
            #expect(result.body == "data: 1\n\ndata: 2\n\ndata: 3\n\n")
        }
    }

    @Test("a large burst is delivered in order through the small reader blocks")
    func largeBurst() throws {
        let payload = (0..<500_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try withServer(handler: { _ in
            .stream(status: 200, headers: []) { stream in
                DispatchQueue.global().async {
                    var offset = 0
                    while offset < payload.count {
                        let end = min(payload.count, offset + 7_777)
                        stream.send(Array(payload[offset..<end]))
                        offset = end
                    }
                    stream.close()
                }
            }
        }) { server throws in
            #expect(try fetch(port: server.port, "GET", "/burst").body == payload)
        }
    }

    @Test("a client that disconnects from a stream: onClose fires and the server keeps answering")
    func clientDisconnects() throws {
        let streams = Lock<[HTTPStream]>([])
        let closed = Atomic<Int>(0)
        try withServer(handler: { request in
            if request.path == "/ok" { return text("ok") }
            return .stream(status: 200, headers: [("Content-Type", "text/event-stream")]) { stream in
                stream.onClose { closed.add(1, ordering: .relaxed) }
                streams.withLock { $0.append(stream) }
                stream.send(Array("data: hello\n\n".utf8))
            }
        }) { server throws in
            let socket = try RawConnection(port: server.port)
            socket.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            let head = try socket.readHead()
            #expect(head.status == 200)
            #expect(try socket.readChunk() == Array("data: hello\n\n".utf8))
            socket.close()
            let stream = try #require(streams.withLock { $0.first })
            #expect(!stream.isClosed)
            // A suspended connection only notices the client is gone when it writes again:
            // keep sending heartbeats, as an SSE endpoint does.
            let noticed = waitUntil(timeout: 10) {
                stream.send(Array(": ping\n\n".utf8))
                usleep(20_000)
                return stream.isClosed
            }
            #expect(noticed)
            #expect(closed.load(ordering: .relaxed) == 1)
            let lateCallback = Atomic<Bool>(false)
            stream.onClose { lateCallback.store(true, ordering: .relaxed) }  // already ended: runs at once
            #expect(lateCallback.load(ordering: .relaxed) == true)
            #expect(waitUntil { server.core.registry.withLock { $0.streams.isEmpty } })
            #expect(try fetch(port: server.port, "GET", "/ok").text == "ok")
        }
    }
}
