import Dispatch
import Foundation
import Locking
import MicroHTTP
import OutboundHTTP
import QueueTesting
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// Creates forwarded to one holder while an exchange with it is out go together in the next
/// (`RelayLanes`, `RelayEnvelope`, `ClusterFront.relay`).
@Suite("Relay: forwarded creates sent together, answered each as alone")
struct RelayTests {
    /// A holder that answers every create 201 with the body it got, 40 ms late, and takes
    /// envelopes (or refuses them with `relayStatus`); counts both.
    final class Holder: Sendable {
        let envelopes = Lock<[Int]>([])
        let refused = Lock(0)
        let alone = Lock(0)
        let server: HTTPServer

        init(relayStatus: Int? = nil, delay: Double = 0.04) throws {
            let (envelopes, alone, refused) = (self.envelopes, self.alone, self.refused)
            @Sendable func created(_ r: HTTPRequest) -> HTTPResponse {
                HTTPResponse(status: 201, headers: [("Content-Type", "application/json"), ("X-Path", r.path)], body: r.body)
            }
            server = HTTPServer(
                configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2, maxBodyBytes: 4 << 20),
                handler: { req in
                    if req.path == RelayEnvelope.path {
                        if let relayStatus {
                            refused.withLock { $0 += 1 }
                            return .response(Problem(relayStatus, "nope", "Nope", "no relays here").response)
                        }
                        guard let inner = RelayEnvelope.decodeRequests(req.body, id: req.id) else {
                            return .response(Problem.badRequest("bad envelope").response)
                        }
                        envelopes.withLock { $0.append(inner.count) }
                        return .deferred { responder in
                            DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
                                let answers = inner.map(created)
                                responder.respond(
                                    HTTPResponse(status: 200, headers: [("Content-Type", RelayEnvelope.contentType)], body: RelayEnvelope.encode(answers)))
                            }
                        }
                    }
                    alone.withLock { $0 += 1 }
                    return .deferred { responder in
                        DispatchQueue.global().asyncAfter(deadline: .now() + delay) { responder.respond(created(req)) }
                    }
                })
            try server.start()
        }
    }

    /// `count` creates sent at once through a forwarding server in front of `holder`; each
    /// answer's status and whether its body is the one its request sent.
    static func createAtOnce(_ count: Int, through holder: Holder, headers extra: [(String, String)] = []) throws -> [(status: Int, own: Bool, path: String?)] {
        let forwarder = Forwarder(selfID: "a", maxResponseBytes: 1 << 20, maxWaitSeconds: 300, relayBytes: 1 << 20)
        // The client's thread busy for 0.3 s (as under load): what is sent meanwhile gathers.
        forwarder.client.onLoop { Thread.sleep(forTimeInterval: 0.3) }
        let base = "http://127.0.0.1:\(holder.server.port)"
        let front = HTTPServer(
            configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 4, maxBodyBytes: 4 << 20),
            handler: { req in forwarder.forward(req, to: base) })
        try front.start()
        defer { front.shutdown(timeout: .seconds(2)) }
        let results = Lock<[Int: (Int, Bool, String?)]>([:])
        // A thread per create (`concurrentPerform` would run one per core): all out at once.
        let done = DispatchGroup()
        for i in 0..<count {
            done.enter()
            Thread.detachNewThread {
                defer { done.leave() }
                send(i)
            }
        }
        done.wait()
        @Sendable func send(_ i: Int) {
            let body = Array(#"{"kind":"immediate","name":"n\#(i)"}"#.utf8)
            let queue = "q\(i % 3)"
            guard let connection = try? RawConnection(port: front.port, timeout: 20),
                let r = try? connection.request(
                    "POST", "/v1/queues/\(queue)/operations", headers: [("Content-Type", "application/json"), ("Authorization", "Bearer t")] + extra, body: body
                )
            else { return }
            connection.close()
            results.withLock { $0[i] = (r.status, r.body == body, r.headers["x-path"]) }
        }
        return (0..<count).map { i in
            results.value[i].map { (status: $0.0, own: $0.1 && $0.2 == "/v1/queues/q\(i % 3)/operations", path: $0.2) } ?? (0, false, nil)
        }
    }

    @Test("creates sent while the client's thread is busy go together, and each gets its own answer")
    func together() async throws {
        try await onThread {
            let holder = try Holder()
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let results = try Self.createAtOnce(40, through: holder)
            #expect(results.allSatisfy { $0.status == 201 && $0.own }, "\(results.filter { !($0.status == 201 && $0.own) })")
            let envelopes = holder.envelopes.value
            #expect(!envelopes.isEmpty, "the creates sent while the thread was busy went together")
            #expect(envelopes.reduce(0, +) + holder.alone.value == 40, "every create reached the holder once")
            #expect(envelopes.allSatisfy { (2...RelayLanes.maxBatch).contains($0) })
        }
    }

    @Test("a holder that refuses envelopes (an older version: 404) gets each create alone, once, and every create is made")
    func refusedEnvelopeGoesAlone() async throws {
        try await onThread {
            let holder = try Holder(relayStatus: 404)
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let results = try Self.createAtOnce(30, through: holder)
            #expect(results.allSatisfy { $0.status == 201 && $0.own })
            #expect(holder.alone.value == 30)
            #expect(holder.refused.value >= 1, "an envelope was tried")
            #expect(holder.envelopes.value.isEmpty)
        }
    }

    @Test("a create the envelope cannot carry exactly (hundreds of header fields) goes alone, with every field")
    func tooManyFieldsGoAlone() async throws {
        try await onThread {
            let holder = try Holder()
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let many = (0..<300).map { ("X-F\($0)", "v") }
            let results = try Self.createAtOnce(12, through: holder, headers: many)
            #expect(results.allSatisfy { $0.status == 201 && $0.own })
            #expect(holder.envelopes.value.isEmpty && holder.alone.value == 12)
        }
        let inner = RelayEnvelope.Inner(method: "POST", path: "/v1/queues/q/operations", query: [:], headers: [("A", "1"), ("a", "2")], body: [])
        #expect(!RelayEnvelope.fits(inner), "a field named twice")
        #expect(RelayEnvelope.decodeRequests(RelayEnvelope.encode([inner]), id: 0) == nil)
    }

    /// A front over `placement` whose dispatcher answers creates in "later" after 30 ms, in
    /// "left" first with the engine's 404 for the queue (its partition leaves, and comes back
    /// 0.2 s later), and the rest at once.
    static func front(_ placement: MovingPlacement) -> ClusterFront {
        let leftOnce = Lock(false)
        return ClusterFrontHoldTests.front(placement, hold: 3) { req in
            if req.path.contains("/later/") {
                return .deferred { responder in
                    DispatchQueue.global().asyncAfter(deadline: .now() + 0.03) {
                        responder.respond(HTTPResponse(status: 201, headers: [("X-Which", "later")], body: req.body))
                    }
                }
            }
            if req.path.contains("/left/"),
                leftOnce.withLock({ gone -> Bool in
                    defer { gone = true }
                    return !gone
                })
            {
                placement.set(served: ["here", "later"])
                DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) { placement.set(served: ["here", "later", "left", "elsewhere"]) }
                return .response(Problem.notFound("no queue named 'left'").response)
            }
            return .response(HTTPResponse(status: 201, headers: [("X-Which", "here")], body: req.body))
        }
    }

    static func inner(_ queue: String, forwarded: Bool = true, query: [String: String] = [:]) -> RelayEnvelope.Inner {
        var headers = [("Content-Type", "application/json")]
        if forwarded { headers += [(Forwarder.header, "b"), (Forwarder.hopsHeader, "1")] }
        return RelayEnvelope.Inner(method: "POST", path: "/v1/queues/\(queue)/operations", query: query, headers: headers, body: Array(queue.utf8))
    }

    @Test(
        "the holder runs each create as alone, in order: one for a queue moving right now is held and answered by its next holder; nothing but forwarded creates is run"
    )
    func holderSide() throws {
        let placement = MovingPlacement()
        placement.set(served: ["here", "later", "left"])
        let front = Self.front(placement)
        let envelope = RelayEnvelope.encode([
            Self.inner("later"), Self.inner("here"), Self.inner("elsewhere"), Self.inner("here", forwarded: false), Self.inner("left"),
            Self.inner("here", query: ["wait": "5"]),
        ])
        let request = HTTPRequest(
            method: "POST", path: RelayEnvelope.path, headers: ["content-type": RelayEnvelope.contentType, Forwarder.header: "b"], body: envelope)
        let t0 = monotonicSeconds()
        let reply = try #require(ClusterFrontHoldTests.answer(front.route(request), within: 5))
        #expect(reply.status == 200)
        let answers = try #require(RelayEnvelope.decodeResponses(reply.body, expected: 6))
        #expect(answers.map(\.status) == [201, 201, 201, 400, 201, 400])
        #expect(answers[0].body == Array("later".utf8) && answers[1].body == Array("here".utf8) && answers[2].body == Array("elsewhere".utf8))
        #expect(answers[4].body == Array("left".utf8))
        #expect(monotonicSeconds() - t0 >= 0.15, "the moving queues' creates were answered once they were served here again")
        // A malformed envelope is refused whole, at once.
        var cut = envelope
        cut.removeLast()
        let refused = try #require(ClusterFrontHoldTests.answer(front.route(HTTPRequest(method: "POST", path: RelayEnvelope.path, body: cut)), within: 1))
        #expect(refused.status == 400)
    }

    @Test("an envelope survives the round trip; every truncation, bad count, trailing byte and mutation is refused or read, never a trap")
    func hostileEnvelopes() {
        let inners = [
            Self.inner("a"),
            RelayEnvelope.Inner(method: "GET", path: "/v1/queues/é", query: ["x": "1", "": ""], headers: [("A", ""), ("b", "two")], body: []),
        ]
        let bytes = RelayEnvelope.encode(inners)
        let decoded = RelayEnvelope.decodeRequests(bytes, id: 7)
        #expect(decoded?.count == 2)
        #expect(decoded?[1].path == "/v1/queues/é" && decoded?[1].query == ["x": "1", "": ""] && decoded?[1].headers == ["a": "", "b": "two"])
        #expect(decoded?[0].body == Array("a".utf8) && decoded?[0].id == 7 && decoded?[0].header(Forwarder.header) == "b")
        for n in 0..<bytes.count { #expect(RelayEnvelope.decodeRequests(Array(bytes.prefix(n)), id: 0) == nil, "cut at \(n)") }
        #expect(RelayEnvelope.decodeRequests(bytes + [0], id: 0) == nil)
        var none = RelayEnvelope.magic
        none += [0, 0]
        #expect(RelayEnvelope.decodeRequests(none, id: 0) == nil)
        #expect(RelayEnvelope.decodeRequests(RelayEnvelope.encode(Array(repeating: Self.inner("a"), count: RelayEnvelope.maxRequests + 1)), id: 0) == nil)
        #expect(RelayEnvelope.decodeRequests(RelayEnvelope.encode(Array(repeating: Self.inner("a"), count: RelayEnvelope.maxRequests)), id: 0)?.count == 256)
        // A body length of 4 GiB in an envelope of a few bytes.
        var huge = RelayEnvelope.encode([RelayEnvelope.Inner(method: "POST", path: "/", query: [:], headers: [], body: [])])
        huge.replaceSubrange((huge.count - 4)..<huge.count, with: [0xFF, 0xFF, 0xFF, 0xFF])
        #expect(RelayEnvelope.decodeRequests(huge, id: 0) == nil)
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<3000 {
            var mutated = bytes
            for _ in 0..<Int.random(in: 1...4, using: &generator) {
                mutated[Int.random(in: 0..<mutated.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
            }
            _ = RelayEnvelope.decodeRequests(mutated, id: 0)
            _ = RelayEnvelope.decodeResponses(mutated, expected: 2)
        }
        let answers = [HTTPResponse(status: 201, headers: [("Location", "/x")], body: [1, 2]), HTTPResponse(status: 503, headers: [], body: [])]
        let reply = RelayEnvelope.encode(answers)
        #expect(RelayEnvelope.decodeResponses(reply, expected: 2)?.map(\.status) == [201, 503])
        #expect(RelayEnvelope.decodeResponses(reply, expected: 3) == nil)
        for n in 0..<reply.count { #expect(RelayEnvelope.decodeResponses(Array(reply.prefix(n)), expected: 2) == nil) }
    }

    @Test("only a plain create small enough goes in an envelope")
    func relayable() {
        let forwarder = Forwarder(selfID: "a", maxResponseBytes: 1 << 20, maxWaitSeconds: 300, relayBytes: 1 << 20)
        func request(_ method: String, _ path: String, query: [String: String] = [:], body: Int = 10) -> HTTPRequest {
            HTTPRequest(method: method, path: path, query: query, body: [UInt8](repeating: 32, count: body))
        }
        #expect(forwarder.relayable(request("POST", "/v1/queues/q/operations")))
        #expect(!forwarder.relayable(request("GET", "/v1/queues/q/operations")))
        #expect(!forwarder.relayable(request("POST", "/v1/queues/q/operations", query: ["x": "1"])))
        #expect(!forwarder.relayable(request("POST", "/v1/queues//operations")))
        #expect(!forwarder.relayable(request("POST", "/v1/queues/q/operations/x")))
        #expect(!forwarder.relayable(request("POST", "/v1/queues/q/barrier")))
        #expect(!forwarder.relayable(request("POST", "/v1/queues/q/operations", body: (1 << 17) + 1)))
        let alone = Forwarder(selfID: "a", maxResponseBytes: 1 << 20, maxWaitSeconds: 300)
        #expect(alone.lanes == nil && !alone.relayable(request("POST", "/v1/queues/q/operations")))
    }
}
