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
    /// envelopes (or refuses them with `relayStatus`); counts both. In an envelope, a create for
    /// a queue whose name starts with "hb" is handed back (`RelayedHold.handedBack`), as a
    /// holder whose placement is behind does.
    final class Holder: Sendable {
        let envelopes = Lock<[Int]>([])
        let refused = Lock(0)
        let alone = Lock(0)
        let server: HTTPServer

        init(relayStatus: Int? = nil, delay: Double = 0.04) throws {
            let (envelopes, alone, refused) = (self.envelopes, self.alone, self.refused)
            @Sendable func created(_ r: HTTPRequest) -> HTTPResponse {
                if r.path.hasPrefix("/v1/queues/hb") { return RelayedHold.handedBack }
                return HTTPResponse(status: 201, headers: [("Content-Type", "application/json"), ("X-Path", r.path)], body: r.body)
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
                        DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
                            responder.respond(HTTPResponse(status: 201, headers: [("Content-Type", "application/json"), ("X-Path", req.path)], body: req.body))
                        }
                    }
                })
            try server.start()
        }
    }

    /// A forwarding server in front of `holder`.
    final class Front: Sendable {
        let forwarder = Forwarder(selfID: "a", maxResponseBytes: 1 << 20, maxWaitSeconds: 300, relayBytes: 1 << 20)
        let server: HTTPServer
        let base: String

        init(_ holder: Holder) throws {
            let base = "http://127.0.0.1:\(holder.server.port)"
            let forwarder = self.forwarder
            self.base = base
            server = HTTPServer(
                configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 4, maxBodyBytes: 4 << 20),
                handler: { req in forwarder.forward(req, to: base) })
            try server.start()
        }

        deinit { server.shutdown(timeout: .seconds(2)) }

        var lanes: RelayLanes? { forwarder.lanes }

        /// Keeps the client's thread busy (as under load) until `count` creates wait in the
        /// holder's lane, then runs `then` on it: what is sent meanwhile goes together.
        func gather(_ count: Int, then: @escaping @Sendable () -> Void = {}) {
            let (lanes, base) = (forwarder.lanes, base)
            forwarder.client.onLoop {
                _ = waitUntil(timeout: 10, every: 0.002) { (lanes?.gathered(for: base) ?? 0) >= count }
                then()
            }
        }

        /// `count` creates sent at once (the i-th to `queue(i)`); each answer's status and
        /// whether its body and path are the ones its request sent.
        func createAtOnce(_ count: Int, queue: @escaping @Sendable (Int) -> String = { "q\($0 % 3)" }, headers extra: [(String, String)] = [])
            -> [(status: Int, own: Bool)]
        {
            let results = Lock<[Int: (Int, Bool)]>([:])
            // A thread per create (`concurrentPerform` would run one per core): all out at once.
            let done = DispatchGroup()
            let port = server.port
            for i in 0..<count {
                done.enter()
                Thread.detachNewThread {
                    defer { done.leave() }
                    let body = Array(#"{"kind":"immediate","name":"n\#(i)"}"#.utf8)
                    let path = "/v1/queues/\(queue(i))/operations"
                    guard let connection = try? RawConnection(port: port, timeout: 20),
                        let r = try? connection.request(
                            "POST", path, headers: [("Content-Type", "application/json"), ("Authorization", "Bearer t")] + extra, body: body)
                    else { return }
                    connection.close()
                    results.withLock { $0[i] = (r.status, r.body == body && r.headers["x-path"] == path) }
                }
            }
            done.wait()
            return (0..<count).map { i in results.value[i].map { (status: $0.0, own: $0.1) } ?? (0, false) }
        }
    }

    @Test("creates sent while the client's thread is busy go together, each gets its own answer, and the next burst goes together too")
    func together() async throws {
        try await onThread {
            let holder = try Holder()
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let front = try Front(holder)
            for burst in 1...2 {
                front.gather(40)
                let results = front.createAtOnce(40)
                #expect(results.allSatisfy { $0.status == 201 && $0.own }, "\(results.filter { !($0.status == 201 && $0.own) })")
                #expect(holder.envelopes.value == Array(repeating: 40, count: burst), "the 40 gathered went in one envelope")
                #expect(holder.alone.value == 0)
            }
        }
    }

    @Test(
        "a holder that refuses envelopes (an older version: 404) gets each create alone, once, and every create is made; those gathered when it refused go alone"
    )
    func refusedEnvelopeGoesAlone() async throws {
        try await onThread {
            let holder = try Holder(relayStatus: 404)
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let front = try Front(holder)
            front.gather(30)
            var results = front.createAtOnce(30)
            #expect(results.allSatisfy { $0.status == 201 && $0.own })
            #expect(holder.alone.value == 30 && holder.refused.value == 1, "one envelope tried, then every create alone")
            // For a while no envelope is tried again.
            results = front.createAtOnce(10)
            #expect(results.allSatisfy { $0.status == 201 && $0.own })
            #expect(holder.alone.value == 40 && holder.refused.value == 1)
            #expect(holder.envelopes.value.isEmpty)

            // Creates gathered before a refusal is known go alone once it is, not as one more
            // envelope.
            let other = try Front(holder)
            let lanes = try #require(other.lanes)
            let base = other.base
            other.gather(12) { lanes.refused(base) }
            results = other.createAtOnce(12)
            #expect(results.allSatisfy { $0.status == 201 && $0.own })
            #expect(holder.alone.value == 52 && holder.refused.value == 1)
        }
    }

    @Test("a create its holder hands back (its placement behind) goes again alone, once, and is made; its envelope mates are answered from the envelope")
    func handedBackGoesAlone() async throws {
        try await onThread {
            let holder = try Holder()
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let front = try Front(holder)
            front.gather(12)
            let results = front.createAtOnce(12) { $0 % 4 == 0 ? "hb\($0)" : "q\($0)" }
            #expect(results.allSatisfy { $0.status == 201 && $0.own }, "\(results)")
            #expect(holder.envelopes.value == [12])
            #expect(holder.alone.value == 3, "the 3 handed back went alone, once each")
        }
    }

    @Test("a create the envelope cannot carry exactly (hundreds of header fields) goes alone, with every field")
    func tooManyFieldsGoAlone() async throws {
        try await onThread {
            let holder = try Holder()
            defer { holder.server.shutdown(timeout: .seconds(2)) }
            let front = try Front(holder)
            let many = (0..<300).map { ("X-F\($0)", "v") }
            front.forwarder.client.onLoop { Thread.sleep(forTimeInterval: 0.2) }
            let results = front.createAtOnce(12, headers: many)
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
        var front = Self.front(placement)
        front.relayHoldSeconds = 3
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

    /// A front over `placement` whose dispatcher answers every create 201 at once, and counts
    /// them by queue.
    static func countingFront(_ placement: MovingPlacement, made: Lock<[String: Int]>) -> ClusterFront {
        ClusterFrontHoldTests.front(placement, hold: 3) { req in
            made.withLock { $0[req.path, default: 0] += 1 }
            return .response(HTTPResponse(status: 201, headers: [("X-Which", "here")], body: req.body))
        }
    }

    @Test(
        "a relayed create held longer than an envelope waits is handed back unstarted and never run here; one whose queue another instance holds is handed back at once; their mates are answered"
    )
    func heldTooLongIsHandedBack() async throws {
        try await onThread {
            let other = try Holder()
            defer { other.server.shutdown(timeout: .seconds(2)) }
            let placement = MovingPlacement()
            placement.set(served: ["here"], holders: ["away": PlacementHolder(instance: "c", url: "http://127.0.0.1:\(other.server.port)")])
            let made = Lock<[String: Int]>([:])
            var front = Self.countingFront(placement, made: made)
            front.relayHoldSeconds = 0.1
            let envelope = RelayEnvelope.encode([Self.inner("here"), Self.inner("moving"), Self.inner("away")])
            let t0 = monotonicSeconds()
            let request = HTTPRequest(method: "POST", path: RelayEnvelope.path, headers: [RelayEnvelope.handBackHeader: "1"], body: envelope)
            let reply = try #require(ClusterFrontHoldTests.answer(front.route(request), within: 3))
            let took = monotonicSeconds() - t0
            let answers = try #require(RelayEnvelope.decodeResponses(reply.body, expected: 3))
            #expect(answers.map(\.status) == [201, 503, 503])
            for i in [1, 2] {
                #expect(answers[i].headers.contains { $0.0 == RelayEnvelope.aloneHeader && $0.1 == "1" })
                #expect(answers[i].headers.contains { $0.0 == Problem.unstartedHeader && $0.1 == "1" })
            }
            #expect(other.alone.value == 0, "not sent on from inside the envelope")
            #expect(took >= 0.09 && took < 1, "answered once the hold was ended, not at its end (\(took) s)")
            // The queue is served here after the envelope was answered: the ended hold runs nothing.
            placement.set(served: ["here", "moving"])
            Thread.sleep(forTimeInterval: 0.2)
            #expect(made.value == ["/v1/queues/here/operations": 1])
        }
    }

    @Test("a relayed create held while its queue moves, whose placement then names another holder, is handed back then, not sent on")
    func heldThenElsewhereIsHandedBack() async throws {
        try await onThread {
            let other = try Holder()
            defer { other.server.shutdown(timeout: .seconds(2)) }
            let placement = MovingPlacement()
            placement.set(served: ["here"])
            let made = Lock<[String: Int]>([:])
            var front = Self.countingFront(placement, made: made)
            front.relayHoldSeconds = 2
            DispatchQueue.global().asyncAfter(deadline: .now() + 0.1) {
                placement.set(served: ["here"], holders: ["moving": PlacementHolder(instance: "c", url: "http://127.0.0.1:\(other.server.port)")])
            }
            let request = HTTPRequest(
                method: "POST", path: RelayEnvelope.path, headers: [RelayEnvelope.handBackHeader: "1"],
                body: RelayEnvelope.encode([Self.inner("here"), Self.inner("moving")]))
            let t0 = monotonicSeconds()
            let reply = try #require(ClusterFrontHoldTests.answer(front.route(request), within: 3))
            let took = monotonicSeconds() - t0
            let answers = try #require(RelayEnvelope.decodeResponses(reply.body, expected: 2))
            #expect(answers.map(\.status) == [201, 503])
            #expect(answers[1].headers.contains { $0.0 == RelayEnvelope.aloneHeader })
            #expect(took >= 0.08 && took < 1.5, "handed back when its holder was known (\(took) s), not at the 2 s bound")
            #expect(other.alone.value == 0)
        }
    }

    @Test("an envelope from a sender that does not send handed-back creates alone (an older version): they are held and sent on at the holder, as before")
    func olderSenderIsServedAsBefore() async throws {
        try await onThread {
            let other = try Holder()
            defer { other.server.shutdown(timeout: .seconds(2)) }
            let placement = MovingPlacement()
            placement.set(served: ["here"], holders: ["away": PlacementHolder(instance: "c", url: "http://127.0.0.1:\(other.server.port)")])
            let made = Lock<[String: Int]>([:])
            var front = Self.countingFront(placement, made: made)
            front.relayHoldSeconds = 0.05
            DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) {
                placement.set(served: ["here", "moving"], holders: ["away": PlacementHolder(instance: "c", url: "http://127.0.0.1:\(other.server.port)")])
            }
            let envelope = RelayEnvelope.encode([Self.inner("here"), Self.inner("moving"), Self.inner("away")])
            let reply = try #require(
                ClusterFrontHoldTests.answer(front.route(HTTPRequest(method: "POST", path: RelayEnvelope.path, body: envelope)), within: 3))
            let answers = try #require(RelayEnvelope.decodeResponses(reply.body, expected: 3))
            #expect(answers.map(\.status) == [201, 201, 201])
            #expect(answers[2].body == Array("away".utf8) && other.alone.value == 1, "sent on to its holder")
            #expect(made.value == ["/v1/queues/here/operations": 1, "/v1/queues/moving/operations": 1])
        }
    }

    @Test("a relayed hold: ended once, never after it left to run; the bound counts from the first hold; ending and leaving exclude each other")
    func relayedHoldAlone() async throws {
        try await onThread {
            // Held, then left to run before the bound: never ended.
            let answers = Lock<[HTTPResponse]>([])
            var responder = HTTPResponder.detached { r in answers.withLock { $0.append(r) } }
            var hold = RelayedHold()
            #expect(hold.holding(responder, for: 0.05))
            #expect(hold.leaving())
            Thread.sleep(forTimeInterval: 0.1)
            #expect(answers.value.isEmpty)
            // Held again after leaving: the bound counts from the first hold, so it ends at once.
            #expect(!hold.holding(responder, for: 0.05))
            #expect(answers.value.map(\.status) == [503])
            #expect(!hold.leaving(), "ended: not run")

            // Held past the bound: ended, and not run after.
            let taken = Lock<[HTTPResponse]>([])
            responder = HTTPResponder.detached { r in taken.withLock { $0.append(r) } }
            hold = RelayedHold()
            #expect(hold.holding(responder, for: 0.05))
            #expect(hold.holding(responder, for: 0.05), "goes on")
            #expect(waitUntil(timeout: 2) { !taken.value.isEmpty })
            #expect(!hold.leaving())
            #expect(taken.value.count == 1 && taken.value[0].headers.contains { $0.0 == RelayEnvelope.aloneHeader })

            // Leaving races the bound: exactly one of "ran" and "handed back", every time.
            for _ in 0..<300 {
                let given = Lock(0)
                let r = HTTPResponder.detached { _ in given.withLock { $0 += 1 } }
                let h = RelayedHold()
                _ = h.holding(r, for: 0.0005)
                usleep(UInt32.random(in: 0...1000))
                let ran = h.leaving()
                usleep(2000)
                #expect(ran != (given.value == 1), "ran \(ran), handed back \(given.value)")
            }
        }
    }

    @Test("an envelope with a create held for a moving queue does not hold up its holder's shutdown; its mates' answers are given")
    func shutdownWithAHeldCreate() async throws {
        try await onThread {
            let placement = MovingPlacement()
            placement.set(served: ["here"])
            let made = Lock<[String: Int]>([:])
            let front = Self.countingFront(placement, made: made)
            let local = try #require(front.local)
            let server = HTTPServer(
                configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2, maxBodyBytes: 4 << 20),
                handler: { req in front.route(req) ?? local(req) })
            try server.start()
            let reply = Lock<TestResponse?>(nil)
            let sent = DispatchGroup()
            sent.enter()
            let port = server.port
            Thread.detachNewThread {
                defer { sent.leave() }
                let connection = try? RawConnection(port: port, timeout: 10)
                let body = RelayEnvelope.encode([Self.inner("here"), Self.inner("moving")])
                let answer = try? connection?.request(
                    "POST", RelayEnvelope.path, headers: [("Content-Type", RelayEnvelope.contentType), (RelayEnvelope.handBackHeader, "1")], body: body)
                reply.withLock { $0 = answer }
            }
            #expect(waitUntil(timeout: 5) { made.value.values.reduce(0, +) == 1 })
            let t0 = monotonicSeconds()
            server.shutdown(timeout: .seconds(8))
            let took = monotonicSeconds() - t0
            sent.wait()
            #expect(took < 2, "the envelope held the drain \(took) s")
            let answer = try #require(reply.value)
            #expect(answer.status == 200)
            let answers = try #require(RelayEnvelope.decodeResponses(answer.body, expected: 2))
            #expect(answers.map(\.status) == [201, 503])
            #expect(answers[1].headers.contains { $0.0 == RelayEnvelope.aloneHeader })
        }
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
