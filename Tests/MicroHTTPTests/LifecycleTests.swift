import Dispatch
import Foundation
import Glibc
import Locking
import Synchronization
import Testing

@testable import MicroHTTP

@Suite("Start and shutdown")
struct LifecycleTests {
    @Test("shutdown answers a pending deferred request with 503 problem+json and returns quickly")
    func shutdownAnswersDeferred() throws {
        let responders = Lock<[HTTPResponder]>([])
        let server = HTTPServer(
            configuration: HTTPServerConfiguration(port: 0, threads: 2),
            handler: { _ in .deferred { responder in responders.withLock { $0.append(responder) } } })
        try server.start()
        let socket = try RawConnection(port: server.port)
        socket.send("GET /poll HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(waitUntil { responders.withLock { $0.count } == 1 })

        let started = ContinuousClock.now
        let finished = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            server.shutdown(timeout: .seconds(3))
            finished.signal()
        }
        let response = try socket.readResponse()
        #expect(response.status == 503)
        #expect(response.headers["content-type"] == "application/problem+json")
        #expect(try jsonObject(response.body)["status"] as? Int == 503)
        #expect(finished.wait(timeout: .now() + 5) == .success)
        #expect(ContinuousClock.now - started < .seconds(2))
        #expect(responders.withLock { $0[0].isAnswered })
        #expect(try socket.readsEOF())
        #expect(throws: (any Error).self) { try RawConnection(port: server.port) }
        server.shutdown()  // idempotent
    }

    @Test("a long poll with an early answer gets it at shutdown instead of 503, also one answered later or marked to be waited for")
    func shutdownAsksLongPollsForTheirEarlyAnswer() throws {
        let responders = Lock<[String: HTTPResponder]>([:])
        let asked = Lock<[String]>([])
        let server = HTTPServer(
            configuration: HTTPServerConfiguration(port: 0, threads: 2),
            handler: { request in
                .deferred { responder in
                    let path = request.path
                    switch path {
                    case "/now":
                        responder.answerEarlyAtShutdown {
                            asked.withLock { $0.append(path) }
                            responder.respond(HTTPResponse(status: 204))
                        }
                    case "/later":
                        // Answered from another thread a moment after it was asked (a commit).
                        responder.answerEarlyAtShutdown {
                            asked.withLock { $0.append(path) }
                            DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) { responder.respond(HTTPResponse(status: 200, body: Array("late".utf8))) }
                        }
                    case "/kept":
                        responder.answerBeforeShutdown()
                        responder.answerEarlyAtShutdown {
                            asked.withLock { $0.append(path) }
                            responder.respond(HTTPResponse(status: 200, body: Array("kept".utf8)))
                        }
                    case "/installed-late":
                        // Marked to be waited for; its early answer comes only after the shutdown
                        // has looked at it (a request held, then relayed, while the server stops).
                        responder.answerBeforeShutdown()
                    case "/answered":
                        // Answered before the shutdown: its early answer is never asked for.
                        responder.answerEarlyAtShutdown { asked.withLock { $0.append(path) } }
                        responder.respond(HTTPResponse(status: 200, body: Array("done".utf8)))
                    default: break
                    }
                    responders.withLock { $0[path] = responder }
                }
            })
        try server.start()
        let paths = ["/now", "/later", "/kept", "/answered", "/plain", "/installed-late"]
        let sockets = try paths.map { _ in try RawConnection(port: server.port) }
        for (socket, path) in zip(sockets, paths) { socket.send("GET \(path) HTTP/1.1\r\nHost: x\r\n\r\n") }
        #expect(waitUntil { responders.withLock { $0.count } == paths.count })
        #expect(try sockets[3].readResponse().text == "done")

        let late = try #require(responders.withLock { $0["/installed-late"] })
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) {
            late.answerEarlyAtShutdown {
                asked.withLock { $0.append("/installed-late") }
                late.respond(HTTPResponse(status: 200, body: Array("installed late".utf8)))
            }
        }
        let started = ContinuousClock.now
        server.shutdown(timeout: .seconds(3))
        #expect(ContinuousClock.now - started < .seconds(2), "the early answer given after the shutdown looked was asked for at once")
        #expect(try sockets[5].readResponse().text == "installed late")
        #expect(try sockets[0].readResponse().status == 204)
        #expect(try sockets[1].readResponse().text == "late")
        #expect(try sockets[2].readResponse().text == "kept")
        // Without an early answer: 503 as before.
        #expect(try sockets[4].readResponse().status == 503)
        #expect(asked.withLock { $0.sorted() } == ["/installed-late", "/kept", "/later", "/now"])
    }

    @Test("shutdown closes open streams (their bodies end properly) and fires onClose")
    func shutdownClosesStreams() throws {
        let closed = Atomic<Int>(0)
        let server = HTTPServer(
            configuration: HTTPServerConfiguration(port: 0, threads: 2),
            handler: { _ in
                .stream(status: 200, headers: []) { stream in
                    stream.onClose { closed.add(1, ordering: .relaxed) }
                    stream.send(Array("first".utf8))
                }
            })
        try server.start()
        let sockets = try (0..<3).map { _ in try RawConnection(port: server.port) }
        for socket in sockets {
            socket.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try socket.readHead().status == 200)
            #expect(try socket.readChunk() == Array("first".utf8))
        }
        let started = ContinuousClock.now
        server.shutdown(timeout: .seconds(3))
        #expect(ContinuousClock.now - started < .seconds(2))
        for socket in sockets { #expect(try socket.readChunk() == nil) }
        #expect(closed.load(ordering: .relaxed) == 3)
    }

    @Test("an idle keep-alive connection does not hold shutdown up to its deadline")
    func idleKeepAliveDoesNotDelayShutdown() throws {
        let server = HTTPServer(configuration: HTTPServerConfiguration(port: 0, threads: 2), handler: { _ in text("ok") })
        try server.start()
        let socket = try RawConnection(port: server.port)
        #expect(try socket.request("GET", "/").status == 200)
        let started = ContinuousClock.now
        server.shutdown(timeout: .seconds(5))
        #expect(ContinuousClock.now - started < .seconds(1))
        #expect(try socket.readsEOF())
    }

    @Test("shutdown waits for a request still being answered")
    func shutdownWaitsForInFlight() throws {
        let entered = DispatchSemaphore(value: 0)
        let server = HTTPServer(
            configuration: HTTPServerConfiguration(port: 0, threads: 2),
            handler: { _ in
                entered.signal()
                usleep(300_000)  // a slow handler (test only: real handlers must not block)
                return text("finished")
            })
        try server.start()
        let socket = try RawConnection(port: server.port)
        socket.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(entered.wait(timeout: .now() + 5) == .success)
        server.shutdown(timeout: .seconds(5))
        let response = try socket.readResponse()
        #expect(response.status == 200)
        #expect(response.text == "finished")
    }

    @Test("starting on a port that is in use throws a readable error")
    func portInUse() throws {
        // A plain listening socket holds the port.
        let holder = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { Glibc.close(holder) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        try withUnsafeMutablePointer(to: &address) { pointer in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                guard bind(holder, address, length) == 0, listen(holder, 1) == 0,
                    getsockname(holder, address, &length) == 0
                else { throw TestClientError("could not hold a port") }
            }
        }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let log = LogSink()
        let server = HTTPServer(configuration: HTTPServerConfiguration(port: port, threads: 1), handler: { _ in text("x") }, log: log.log)
        let error = #expect(throws: HTTPServerError.self) { try server.start() }
        #expect(error?.message.contains("127.0.0.1:\(port)") == true)
        #expect(error?.message.contains("in use") == true, "message: \(error?.message ?? "")")
        server.shutdown()

        // And a second server on a running server's port.
        try withServer(handler: { _ in text("first") }) { first throws in
            let second = HTTPServer(configuration: HTTPServerConfiguration(port: first.port, threads: 1), handler: { _ in text("second") })
            #expect(throws: HTTPServerError.self) { try second.start() }
            #expect(try fetch(port: first.port, "GET", "/").text == "first")
        }
    }

    @Test("an invalid host or a second start throws")
    func invalidConfiguration() throws {
        let server = HTTPServer(configuration: HTTPServerConfiguration(host: "localhost", port: 0), handler: { _ in text("x") })
        let error = #expect(throws: HTTPServerError.self) { try server.start() }
        #expect(error?.message.contains("localhost") == true)
        try withServer(handler: { _ in text("x") }) { running throws in
            #expect(throws: HTTPServerError.self) { try running.start() }
        }
    }

    @Test("binding 0.0.0.0 serves on loopback too, and the default configuration is sane")
    func allInterfaces() throws {
        let defaults = HTTPServerConfiguration()
        #expect(defaults.host == "127.0.0.1")
        #expect(defaults.port == 8080)
        #expect(defaults.threads == ProcessInfo.processInfo.activeProcessorCount)
        #expect(defaults.maxBodyBytes == 1 << 20)
        let server = HTTPServer(configuration: HTTPServerConfiguration(host: "0.0.0.0", port: 0, threads: 1), handler: { _ in text("any") })
        try server.start()
        defer { server.shutdown() }
        #expect(server.port > 0)
        #expect(try fetch(port: server.port, "GET", "/").text == "any")
    }
}
