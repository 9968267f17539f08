import Dispatch
import Foundation
import Glibc
import Locking
import Synchronization
import Testing

@testable import MicroHTTP

@Suite("Deferred responses")
struct DeferredTests {
    @Test("a deferred request answered 200 ms later from another thread")
    func answeredLater() throws {
        let responders = Lock<[HTTPResponder]>([])
        try withServer(handler: { request in
            .deferred { responder in
                responders.withLock { $0.append(responder) }
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(200)) {
                    responder.respond(HTTPResponse(status: 200, body: Array("late \(request.path)".utf8)))
                }
            }
        }) { server throws in
            let started = ContinuousClock.now
            let response = try fetch(port: server.port, "GET", "/wait")
            let elapsed = ContinuousClock.now - started
            #expect(response.status == 200)
            #expect(response.text == "late /wait")
            #expect(elapsed >= .milliseconds(190))
            #expect(elapsed < .seconds(3))
            let responder = try #require(responders.withLock { $0.first })
            #expect(responder.isAnswered)
            // Later answers are ignored, also after the request is over.
            responder.respond(HTTPResponse(status: 500))
            #expect(waitUntil { server.core.registry.withLock { $0.responders.isEmpty } })
        }
    }

    @Test("a deferred request answered synchronously inside the closure, then once more")
    func answeredSynchronously() throws {
        try withServer(handler: { _ in
            .deferred { responder in
                #expect(!responder.isAnswered)
                responder.respond(HTTPResponse(status: 202, body: Array("now".utf8)))
                responder.respond(HTTPResponse(status: 500, body: Array("ignored".utf8)))
                #expect(responder.isAnswered)
            }
        }) { server throws in
            let socket = try RawConnection(port: server.port)
            for _ in 0..<3 {
                let response = try socket.request("GET", "/sync")
                #expect(response.status == 202)
                #expect(response.text == "now")
            }
        }
    }

    @Test("a deferred request answered from another thread while the closure is still running")
    func answeredDuringClosure() throws {
        try withServer(handler: { _ in
            .deferred { responder in
                let done = DispatchSemaphore(value: 0)
                DispatchQueue.global().async {
                    responder.respond(HTTPResponse(status: 200, body: Array("racing".utf8)))
                    done.signal()
                }
                done.wait()  // a test-only wait: the answer arrives before the connection is suspended
            }
        }) { server throws in
            for _ in 0..<20 { #expect(try fetch(port: server.port, "GET", "/race").text == "racing") }
        }
    }

    @Test("200 concurrent deferred requests are all answered, each with its own answer")
    func manyConcurrent() throws {
        let count = 200
        let pending = Lock<[(String, HTTPResponder)]>([])
        try withServer(handler: { request in
            .deferred { responder in
                let all: [(String, HTTPResponder)]? = pending.withLock { pending in
                    pending.append((request.query["n"] ?? "?", responder))
                    return pending.count == count ? pending : nil
                }
                // The last one to arrive answers everybody, from another thread.
                if let all {
                    DispatchQueue.global().async {
                        for (n, responder) in all { responder.respond(HTTPResponse(status: 200, body: Array("n=\(n)".utf8))) }
                    }
                }
            }
        }) { server throws in
            let sockets = try (0..<count).map { _ in try RawConnection(port: server.port) }
            for (index, socket) in sockets.enumerated() {
                #expect(socket.send("GET /poll?n=\(index) HTTP/1.1\r\nHost: x\r\n\r\n"))
            }
            for (index, socket) in sockets.enumerated() {
                let response = try socket.readResponse()
                #expect(response.status == 200)
                #expect(response.text == "n=\(index)")
            }
            #expect(waitUntil { server.core.inFlight.load(ordering: .acquiring) == 0 })
            #expect(server.core.registry.withLock { $0.responders.isEmpty })
        }
    }

    @Test("answering a deferred request whose client has gone is harmless")
    func answerAfterClientLeft() throws {
        let responders = Lock<[HTTPResponder]>([])
        try withServer(handler: { request in
            if request.path == "/ok" { return text("ok") }
            return .deferred { responder in responders.withLock { $0.append(responder) } }
        }) { server throws in
            for _ in 0..<10 {
                let socket = try RawConnection(port: server.port)
                socket.send("GET /poll HTTP/1.1\r\nHost: x\r\n\r\n")
                socket.close()
            }
            #expect(waitUntil { responders.withLock { $0.count } == 10 })
            for responder in responders.withLock({ $0 }) {
                responder.respond(HTTPResponse(status: 200, body: Array("too late".utf8)))
            }
            #expect(waitUntil { server.core.inFlight.load(ordering: .acquiring) == 0 })
            for responder in responders.withLock({ $0 }) { responder.respond(HTTPResponse(status: 200)) }
            #expect(try fetch(port: server.port, "GET", "/ok").text == "ok")
        }
    }
}
