import Dispatch
import Foundation
import Locking
import MicroHTTP
import QueueEngine
import SQLiteStore
import TestKit
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// A placement whose queues change hands while a test runs: this instance ("a") serves what
/// `served` says, and `holders` says who holds the rest (nobody: moving).
final class MovingPlacement: FrontTestPlacement, @unchecked Sendable {
    // @unchecked: both maps are touched only under `lock`.
    private let lock = Lock<(served: Set<String>, holders: [String: PlacementHolder])>(([], [:]))
    let selfID = "a"
    let selfURL = "http://a:1"

    func set(served: Set<String> = [], holders: [String: PlacementHolder] = [:]) { lock.withLock { $0 = (served, holders) } }
    func serves(queue name: String) -> Bool { lock.withLock { $0.served.contains(name) } }
    func holder(ofQueue name: String) -> PlacementHolder? { lock.withLock { $0.holders[name] } }

    let gate = ServingGate()
    func whileServing<T>(_ body: () throws -> T) rethrows -> T { try gate.pass(body) }

    /// As a partition holder gives a queue up: out of `served`, then the requests decided
    /// "served here" before are waited for (`PartitionOwner.release`).
    func giveUp(_ queue: String) {
        lock.withLock { _ = $0.served.remove(queue) }
        gate.drain(within: 2)
    }
}

/// A request for a queue in the middle of its handover waits for the new holder (API.md "Many
/// instances"), bounded; over a placement that changes while it waits: no PostgreSQL.
@Suite("ClusterFront holds a request while its queue moves")
struct ClusterFrontHoldTests {
    static func front(_ placement: MovingPlacement, hold: Double, local: @escaping @Sendable (HTTPRequest) -> HTTPHandlerResult) -> ClusterFront {
        let access = Access(token: nil, readToken: nil)
        var front = ClusterFront(
            placement: placement, router: RouteTables.api(), engine: QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore()),
            forwarder: Forwarder(selfID: "a", maxResponseBytes: 1 << 20, maxWaitSeconds: 300), access: access,
            queues: OperationQueues(read: { _ in nil }, readMany: { _ in [:] }),
            reads: APIDispatcher(router: RouteTables.followerReads(), access: access) { _, _ in })
        front.local = local
        front.holdSeconds = hold
        front.holdEvery = 0.01
        return front
    }

    /// Runs `result` on a detached responder; the answer once given (nil: none within `within`).
    static func answer(_ result: HTTPHandlerResult?, within seconds: Double) -> HTTPResponse? {
        guard let result else { return nil }
        let responder = HTTPResponder.detached()
        ClusterFront.answer(result, with: responder)
        _ = waitUntil(timeout: seconds, every: 0.005) { responder.detachedResponse != nil }
        return responder.detachedResponse
    }

    @Test("a queue taken in here while its request waits is answered here, not refused")
    func answeredHereOnceServed() {
        let placement = MovingPlacement()
        let answered = Lock(0)
        let front = Self.front(placement, hold: 3) { _ in
            answered.withLock { $0 += 1 }
            return .response(HTTPResponse(status: 201, headers: [], body: Array("made here".utf8)))
        }
        let request = ClusterFrontTests.request("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#)
        let result = front.route(request)
        #expect(result != nil, "held, not handed to the dispatcher at once")
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) { placement.set(served: ["moving"]) }
        let t0 = monotonicSeconds()
        let response = Self.answer(result, within: 5)
        #expect(response?.status == 201)
        #expect(answered.value == 1)
        #expect(monotonicSeconds() - t0 >= 0.15, "answered before the queue was taken in")
    }

    @Test("a queue whose partition leaves between the decision and the engine (its 404) is held for its next holder, not refused")
    func leftBeforeTheEngineLooked() {
        let placement = MovingPlacement()
        placement.set(served: ["moving", "here"])
        let calls = Lock(0)
        let front = Self.front(placement, hold: 3) { request in
            let n = calls.withLock { c -> Int in
                c += 1; return c
            }
            if request.path.contains("/here/") { return .response(HTTPResponse(status: 404, headers: [], body: [])) }
            if n > 1 { return .response(HTTPResponse(status: 201, headers: [], body: [])) }
            // The handover happens now: the engine no longer has the queue, nobody holds it yet.
            placement.set(served: ["here"])
            DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) { placement.set(served: ["here", "moving"]) }
            return .response(Problem.notFound("no queue named 'moving'").response)
        }
        let response = Self.answer(front.route(ClusterFrontTests.request("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#)), within: 5)
        #expect(response?.status == 201, "answered by the queue's next holder (here again)")
        #expect(calls.value == 2)
        // A 404 for a queue this instance still serves is the answer, at once.
        let missing = Self.answer(front.route(ClusterFrontTests.request("POST /v1/queues/here/operations", #"{"kind":"immediate"}"#)), within: 5)
        #expect(missing?.status == 404)
        #expect(calls.value == 3)
        // A 404 about something else (an operation read again after a cancel changed it) is the
        // answer even when the queue has left: sent on, the change would be made twice.
        placement.set(served: ["cancelled"])
        let again = Self.front(placement, hold: 3) { _ in
            placement.set(served: [])
            return .response(Problem.notFound("no operation op-0000000000000001").response)
        }
        let cancel = Self.answer(again.route(ClusterFrontTests.request("POST /v1/queues/cancelled/operations", #"{"kind":"immediate"}"#)), within: 5)
        #expect(cancel?.status == 404)
    }

    @Test("a keyed create or batch whose queue leaves before the engine looks: held for the next holder, and its 404 never kept as the key's answer")
    func keyedCreateLeftBeforeTheEngineLooked() throws {
        try withTemporaryDirectory { dir in
            // A durable store: a kept answer waits for its commit (a deferred answer).
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
            let (router, engine) = RouteTables.api(store: store)
            let dispatcher = APIDispatcher(router: router, access: Access(token: nil, readToken: nil)) { _, _ in }
            let placement = MovingPlacement()
            placement.set(served: ["moving"])
            let calls = Lock(0)
            let front = Self.front(placement, hold: 3) { request in
                let first = calls.withLock { c -> Bool in
                    c += 1; return c == 1
                }
                // The handover: the queue is not in the engine and has left this instance's
                // placement; it comes back (this instance its next holder) 0.2 s later.
                for queue in ["moving", "leaves"] where first && placement.serves(queue: queue) {
                    placement.set(served: placement.serves(queue: "stays") ? ["stays"] : [])
                    DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) {
                        _ = try? engine.createQueue(name: queue)
                        placement.set(served: queue == "leaves" ? ["stays", "leaves"] : [queue])
                    }
                }
                return dispatcher.handle(request)
            }
            let keyed = ["idempotency-key": "k-moving", "content-type": "application/json"]
            let body = #"{"kind":"immediate"}"#
            let response = Self.answer(front.route(ClusterFrontTests.request("POST /v1/queues/moving/operations", body, headers: keyed)), within: 5)
            #expect(response?.status == 201, "answered by the queue's next holder, not 404: \(String(decoding: response?.body ?? [], as: UTF8.self))")
            #expect(calls.value == 2)
            // A 404 for a queue this instance serves (none named 'absent') is the answer, and is
            // not kept either: once the queue exists, the same key creates.
            placement.set(served: ["moving", "absent"])
            let keyedAbsent = ClusterFrontTests.request(
                "POST /v1/queues/absent/operations", body, headers: ["idempotency-key": "k-absent", "content-type": "application/json"])
            let absent = Self.answer(front.route(keyedAbsent), within: 5)
            #expect(absent?.status == 404)
            try engine.createQueue(name: "absent")
            let retried = Self.answer(front.route(keyedAbsent), within: 5)
            #expect(retried?.status == 201)
            // A keyed batch over two queues this instance serves, one of which leaves before the
            // engine looks: all or none, so nothing was made; held, and made at the next holder.
            try engine.createQueue(name: "stays")
            placement.set(served: ["stays", "leaves"])
            calls.withLock { $0 = 0 }
            let batch = #"{"operations":[{"queue":"stays","kind":"immediate"},{"queue":"leaves","kind":"immediate"}]}"#
            let made = Self.answer(
                front.route(
                    ClusterFrontTests.request("POST /v1/operations:batch", batch, headers: ["idempotency-key": "k-batch", "content-type": "application/json"])),
                within: 5)
            #expect(made?.status == 201, "the batch made at the next holder: \(String(decoding: made?.body ?? [], as: UTF8.self))")
            #expect(calls.value == 2)
        }
    }

    @Test("the engine's 404 for a queue, alone or as a batch element's, is told from other 404s")
    func queueMissingForms() {
        func answer(_ detail: String, _ status: Int = 404) -> HTTPResponse { Problem(status, "not-found", "Not Found", detail).response }
        #expect(ClusterFront.queueMissing(answer("no queue named 'q'"), "q"))
        #expect(ClusterFront.queueMissing(answer("operations[12].queue: no queue named 'q'"), "q"))
        #expect(!ClusterFront.queueMissing(answer("operations[12].queue: no queue named 'q'"), "p"))
        #expect(!ClusterFront.queueMissing(answer("operations[].queue: no queue named 'q'"), "q"))
        #expect(!ClusterFront.queueMissing(answer("operations[1x].queue: no queue named 'q'"), "q"))
        #expect(!ClusterFront.queueMissing(answer("operations[1].dependencies: no operation with id 'q'"), "q"))
        #expect(!ClusterFront.queueMissing(answer("no queue named 'q'", 409), "q"))
    }

    /// A keyed suspend of queue "moving" through a front that holds requests 0.3 s: its
    /// answer, the answer's body, and how long it took.
    static func suspendHeld(over placement: MovingPlacement) -> (response: HTTPResponse?, text: String, waited: Double) {
        let front = Self.front(placement, hold: 0.3) { _ in .response(HTTPResponse(status: 201, headers: [], body: [])) }
        let t0 = monotonicSeconds()
        let response = Self.answer(front.route(ClusterFrontTests.request("POST /v1/queues/moving/suspend", headers: Self.keyed)), within: 5)
        return (response, String(decoding: response?.body ?? [], as: UTF8.self), monotonicSeconds() - t0)
    }

    @Test("nobody takes the queue within the bound: 503 no-owner once it has passed, not before")
    func refusedPastTheBound() {
        let (response, text, waited) = Self.suspendHeld(over: MovingPlacement())
        #expect(response?.status == 503)
        #expect(text.contains("no-owner"))
        #expect(waited >= 0.25 && waited < 3, "held \(waited) s for a bound of 0.3 s")
    }

    static let keyed = ["idempotency-key": "k1"]

    @Test("a holder that stopped listening: a request that may be sent twice waits for the next holder and is answered there")
    func heldWhenTheHolderIsGone() {
        let placement = MovingPlacement()
        placement.set(holders: ["moving": PlacementHolder(instance: "b", url: "http://127.0.0.1:\(closedPort())")])
        let front = Self.front(placement, hold: 3) { _ in .response(HTTPResponse(status: 201, headers: [], body: Array("made here".utf8))) }
        let result = front.route(ClusterFrontTests.request("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#, headers: Self.keyed))
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) { placement.set(served: ["moving"]) }
        let t0 = monotonicSeconds()
        let response = Self.answer(result, within: 5)
        let text = String(decoding: response?.body ?? [], as: UTF8.self)
        #expect(response?.status == 201, "\(text)")
        #expect(monotonicSeconds() - t0 >= 0.2, "answered before the queue moved")
    }

    @Test("a change without a key to a holder that stopped listening: 503 at once, never sent twice")
    func notResentWithoutAKey() {
        let placement = MovingPlacement()
        placement.set(holders: ["moving": PlacementHolder(instance: "b", url: "http://127.0.0.1:\(closedPort())")])
        let front = Self.front(placement, hold: 3) { _ in .response(HTTPResponse(status: 201, headers: [], body: [])) }
        let result = front.route(ClusterFrontTests.request("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#))
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) { placement.set(served: ["moving"]) }
        let t0 = monotonicSeconds()
        let response = Self.answer(result, within: 5)
        #expect(response?.status == 503)
        #expect(monotonicSeconds() - t0 < 0.25, "held although it may have arrived")
    }

    /// A stub holder answering every request with `response`.
    static func holder(_ response: HTTPResponse) throws -> RawServer {
        try RawServer { connection, _ in
            while (try? connection.readRequest()) != nil {
                var head = "HTTP/1.1 \(response.status) X\r\nContent-Length: \(response.body.count)\r\n"
                for (name, value) in response.headers where name.lowercased() != "connection" { head += "\(name): \(value)\r\n" }
                guard connection.send(Array((head + "\r\n").utf8) + response.body) else { return }
            }
        }
    }

    @Test("a holder that refuses the request unstarted (503 shutting-down, Opqd-Unstarted): it goes to the next holder")
    func resentWhenTheHolderIsStopping() throws {
        let stopping = try Self.holder(Problem.refusedUnstarted.response)
        defer { stopping.stop() }
        let next = try RawServer { connection, _ in
            while (try? connection.readRequest()) != nil {
                guard connection.send("HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nnext") else { return }
            }
        }
        defer { next.stop() }
        let placement = MovingPlacement()
        placement.set(holders: ["moving": PlacementHolder(instance: "b", url: stopping.base)])
        let front = Self.front(placement, hold: 3) { _ in .response(HTTPResponse(status: 500, headers: [], body: [])) }
        let result = front.route(ClusterFrontTests.request("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#))
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) { placement.set(holders: ["moving": PlacementHolder(instance: "c", url: next.base)]) }
        let response = Self.answer(result, within: 5)
        #expect(response?.status == 201)
        let text = String(decoding: response?.body ?? [], as: UTF8.self)
        #expect(text == "next")
    }

    @Test("a 503 shutting-down that may come after the request did something is relayed, not sent on")
    func lateShuttingDownIsRelayed() throws {
        let stopping = try Self.holder(Problem.shuttingDown.response)
        defer { stopping.stop() }
        let placement = MovingPlacement()
        placement.set(holders: ["moving": PlacementHolder(instance: "b", url: stopping.base)])
        let front = Self.front(placement, hold: 3) { _ in .response(HTTPResponse(status: 201, headers: [], body: [])) }
        let result = front.route(ClusterFrontTests.request("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#, headers: Self.keyed))
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) { placement.set(served: ["moving"]) }
        let response = Self.answer(result, within: 5)
        #expect(response?.status == 503)
    }

    @Test("a holder that crashed and still holds the queue: 503 owner-unavailable once the bound has passed")
    func crashedHolderPastTheBound() {
        let placement = MovingPlacement()
        placement.set(holders: ["moving": PlacementHolder(instance: "b", url: "http://127.0.0.1:\(closedPort())")])
        let (response, text, waited) = Self.suspendHeld(over: placement)
        #expect(response?.status == 503)
        #expect(text.contains("owner-unavailable"), "\(text)")
        #expect(waited >= 0.25 && waited < 3, "held \(waited) s for a bound of 0.3 s")
    }

    @Test(
        "a queue given up while a request decided 'served here' is in its handler: the engine lets it go only after that handler, and a request decided after is not served here"
    )
    func givenUpAfterTheHandler() async throws {
        try await onThread {
            let placement = MovingPlacement()
            placement.set(served: ["slow"])
            // True once the engine let the queue go: the handler then finds no queue.
            let released = Lock(false)
            let entered = DispatchSemaphore(value: 0)
            let calls = Lock(0)
            let front = Self.front(placement, hold: 3) { _ in
                calls.withLock { $0 += 1 }
                entered.signal()
                Thread.sleep(forTimeInterval: 0.2)
                return .response(released.value ? Problem.notFound("no queue named 'slow'").response : HTTPResponse(status: 201, headers: [], body: []))
            }
            let request = ClusterFrontTests.request("POST /v1/queues/slow/operations", #"{"kind":"immediate"}"#)
            let first = Lock<HTTPResponse?>(nil)
            let done = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                let answer = Self.answer(front.route(request), within: 3)
                first.withLock { $0 = answer }
                done.signal()
            }
            entered.wait()
            let t0 = monotonicSeconds()
            placement.giveUp("slow")
            let waited = monotonicSeconds() - t0
            released.withLock { $0 = true }
            #expect(waited >= 0.1, "the queue was let go of after \(waited) s, under the handler")
            // Decided now: nobody holds the queue, so it is held, not run here.
            let second = front.route(request)
            #expect(second != nil)
            done.wait()
            #expect(first.value?.status == 201)
            Thread.sleep(forTimeInterval: 0.1)
            #expect(calls.value == 1)
        }
    }

    @Test("a request decided 'served here' whose queue left before it entered the gate is not run here, but decided again")
    func servedButLeftBeforeTheGate() {
        let placement = MovingPlacement()
        let calls = Lock(0)
        let front = Self.front(placement, hold: 3) { _ in
            calls.withLock { $0 += 1 }
            return .response(HTTPResponse(status: 201, headers: [], body: []))
        }
        let request = ClusterFrontTests.request("POST /v1/queues/gone/operations", #"{"kind":"immediate"}"#)
        let decision = ClusterFront.Decision.served(queues: ["gone"])
        guard case .moved = front.runServed(["gone"], decision, request, until: .now() + 3) else {
            Issue.record("run although its queue is not served here")
            return
        }
        placement.set(served: ["gone"])
        guard case .ran = front.runServed(["gone"], decision, request, until: .now() + 3) else {
            Issue.record("not run although served here")
            return
        }
        #expect(calls.value == 1)
    }

    @Test("a gate's drain waits for those inside before it, not for those after, and no longer than its bound")
    func gate() async throws {
        try await onThread {
            let gate = ServingGate()
            #expect(gate.drain(within: 1), "nobody inside")
            let inside = DispatchSemaphore(value: 0)
            let leave = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                gate.pass {
                    inside.signal()
                    leave.wait()
                }
            }
            inside.wait()
            let t0 = monotonicSeconds()
            #expect(!gate.drain(within: 0.1), "one inside past the bound")
            #expect(monotonicSeconds() - t0 >= 0.09)
            // One that enters after a drain began is not waited for by it.
            let later = DispatchSemaphore(value: 0)
            let draining = Lock(false)
            Thread.detachNewThread {
                let drained = gate.drain(within: 5)
                draining.withLock { $0 = drained }
                later.signal()
            }
            Thread.sleep(forTimeInterval: 0.05)
            gate.pass {
                leave.signal()
                #expect(later.wait(timeout: .now() + 5) == .success, "the drain ended while a later one was inside")
            }
            #expect(draining.value)
        }
    }

    @Test("a wait served here whose queue moves away follows it: the rest of its wait is asked of the new holder, and the client sees one answer")
    func waitFollowsItsQueue() throws {
        let seen = Lock<[String]>([])
        let next = try RawServer { connection, _ in
            while let r = try? connection.readRequest() {
                seen.withLock { $0.append(r.path + " hops=" + (r.headers["opqd-forwarded-hops"] ?? "-")) }
                guard connection.send("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nat b !") else { return }
            }
        }
        defer { next.stop() }
        let placement = MovingPlacement()
        placement.set(served: ["moving", "staying"])
        // Seconds the moved queue has no holder (a handover under way) before b serves it.
        let gap = Lock(0.0)
        let front = Self.front(placement, hold: 3) { request in
            .deferred { responder in
                // At shutdown, this handler's early answer.
                responder.answerEarlyAtShutdown { responder.respond(HTTPResponse(status: 200, body: Array("early".utf8))) }
                DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) {
                    if request.path.contains("/staying/") { return responder.respond(HTTPResponse(status: 200, body: Array("here".utf8))) }
                    // The handover: the queue leaves, its wait ends "moved".
                    let b = PlacementHolder(instance: "b", url: next.base)
                    let noHolder = gap.value
                    placement.set(served: ["staying"], holders: noHolder > 0 ? [:] : ["moving": b])
                    if noHolder > 0 {
                        DispatchQueue.global().asyncAfter(deadline: .now() + noHolder) { placement.set(served: ["staying"], holders: ["moving": b]) }
                    }
                    responder.respond(LongPoll.moved("moved while it waited"))
                }
            }
        }
        /// The wait b was asked for, from the line it saw (`… timeout=S … hops=N`).
        func askedFor(_ line: String) -> Double? {
            line.range(of: "timeout=").flatMap { Double(line[$0.upperBound...].prefix { $0 != " " && $0 != "&" }) }
        }
        let wait = ClusterFrontTests.request("GET /v1/queues/moving/wait")
        let timed = HTTPRequest(method: wait.method, path: wait.path, query: ["timeout": "5"])
        let t0 = monotonicSeconds()
        let response = Self.answer(front.route(timed), within: 5)
        #expect(response?.status == 200 && String(decoding: response?.body ?? [], as: UTF8.self) == "at b !", "\(String(describing: response))")
        #expect(monotonicSeconds() - t0 < 2)
        // The rest of the wait, not all of it again, and the hop counted.
        let asked = seen.value
        #expect(asked.count == 1)
        if let line = asked.first, let left = askedFor(line) {
            #expect(left > 2.5 && left < 4.8, "asked for \(left) s of 5, 0.3 s spent: \(line)")
            #expect(line.hasSuffix("hops=1"))
        } else {
            Issue.record("no timeout in \(asked)")
        }
        // One forwarded here twice already (its queue moved on its way) follows its queue too:
        // the hops it took do not count against a move made while it waited.
        placement.set(served: ["moving", "staying"])
        let twice = HTTPRequest(
            method: "GET", path: "/v1/queues/moving/wait", query: ["timeout": "5"], headers: [Forwarder.header: "c", Forwarder.hopsHeader: "2"])
        #expect(Self.answer(front.route(twice), within: 5)?.body == Array("at b !".utf8))
        #expect(seen.value.count == 2 && seen.value.last?.hasSuffix("hops=1") == true, "\(seen.value)")
        // A wait without a timeout (30 s) follows its queue too, with the rest of its 30 s.
        placement.set(served: ["moving", "staying"])
        let plain = HTTPRequest(method: "GET", path: "/v1/queues/moving/wait")
        #expect(Self.answer(front.route(plain), within: 5)?.body == Array("at b !".utf8))
        if let line = seen.value.last, let left = askedFor(line) {
            #expect(left > 27 && left < 29.8, "asked for \(left) s of 30: \(line)")
        } else {
            Issue.record("no timeout in \(seen.value)")
        }
        // Held 1.5 s for the new holder: that time is part of the wait too (5 − 0.3 − 1.5 s
        // left), so the client's answer comes within its timeout.
        gap.withLock { $0 = 1.5 }
        placement.set(served: ["moving", "staying"])
        #expect(Self.answer(front.route(timed), within: 5)?.body == Array("at b !".utf8))
        if let line = seen.value.last, let left = askedFor(line) {
            #expect(left > 2 && left < 3.3, "asked for \(left) s of 5, 1.8 s spent: \(line)")
        } else {
            Issue.record("no timeout in \(seen.value)")
        }
        gap.withLock { $0 = 0 }
        // A wait whose queue stays: its own answer, unchanged.
        let here = HTTPRequest(method: "GET", path: "/v1/queues/staying/wait", query: ["timeout": "5"])
        #expect(Self.answer(front.route(here), within: 5)?.body == Array("here".utf8))
        // Shutdown's early answer reaches the handler through the front.
        let early = HTTPResponder.detached()
        if let result = front.route(here) { ClusterFront.answer(result, with: early) }
        #expect(early.hurry())
        #expect(early.detachedResponse?.body == Array("early".utf8))
    }

    @Test("long polls forwarded to their holder, at this instance's shutdown: a claim 204 without asking again, a wait asked again with no wait; never 503")
    func forwardedLongPollsAtShutdown() throws {
        let asked = Lock<[String]>([])
        let cut = Lock(0)
        let holder = try RawServer(timeout: 20) { connection, server in
            while let r = try? connection.readRequest() {
                asked.withLock { $0.append(r.method + " " + r.path) }
                if r.path.contains("timeout=0") {
                    guard connection.send("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnow") else { return }
                    continue
                }
                // The long poll: no answer; the exchange is cut by the forwarding instance.
                while !server.isStopping, (try? connection.readRequest()) != nil {}
                if !server.isStopping { cut.withLock { $0 += 1 } }
                return
            }
        }
        defer { holder.stop() }
        let placement = MovingPlacement()
        placement.set(holders: ["elsewhere": PlacementHolder(instance: "b", url: holder.base)])
        let front = Self.front(placement, hold: 3) { _ in .response(HTTPResponse(status: 500)) }
        // This instance's real server in front of it, so its shutdown is the real one.
        let server = HTTPServer(
            configuration: HTTPServerConfiguration(port: 0, threads: 2), handler: { front.route($0) ?? .response(HTTPResponse(status: 500)) })
        try server.start()
        let answers = Lock<[String: HTTPOutcome]>([:])
        let group = DispatchGroup()
        for (method, path) in [("POST", "/v1/queues/elsewhere/claim?wait=30"), ("GET", "/v1/queues/elsewhere/wait")] {
            group.enter()
            DispatchQueue.global().async {
                let outcome = HTTPExchange.run(port: server.port, method: method, path: path, body: method == "POST" ? Array("{}".utf8) : nil, timeout: 20)
                answers.withLock { $0[method] = outcome }
                group.leave()
            }
        }
        #expect(waitUntil(timeout: 10, every: 0.01) { asked.value.count == 2 }, "both long polls reached their holder: \(asked.value)")
        let t0 = monotonicSeconds()
        server.shutdown(timeout: .seconds(8))
        #expect(group.wait(timeout: .now() + 10) == .success)
        #expect(monotonicSeconds() - t0 < 4, "answered at the shutdown, not at its deadline")
        #expect(answers.value["POST"]?.response?.status == 204, "\(String(describing: answers.value["POST"]))")
        let wait = answers.value["GET"]?.response
        #expect(wait?.status == 200 && wait?.text == "now", "\(String(describing: wait))")
        let calls = asked.value
        #expect(calls.filter { $0.hasPrefix("POST") }.count == 1, "a claim is not asked again: \(calls)")
        #expect(calls.contains { $0.hasPrefix("GET /v1/queues/elsewhere/wait") && $0.contains("timeout=0") }, "\(calls)")
        #expect(waitUntil(timeout: 5, every: 0.01) { cut.value == 2 }, "the holder saw both long exchanges cut")
    }

    @Test("without a dispatcher to hand over to, the front refuses at once, as before")
    func noHoldWithoutLocal() {
        var front = Self.front(MovingPlacement(), hold: 3) { _ in .response(HTTPResponse(status: 201, headers: [], body: [])) }
        front.local = nil
        guard case let .routed(_, .response(r))? = front.route(ClusterFrontTests.request("POST /v1/queues/moving/suspend")) else {
            Issue.record("not answered at once")
            return
        }
        #expect(r.status == 503)
    }
}

@Suite("Forwarder: the hop count travels with a forwarded request")
struct ForwarderHopsTests {
    @Test func hopsCountUpAndASpoofedCountIsReplaced() {
        let f = Forwarder(selfID: "me", maxResponseBytes: 1 << 20, maxWaitSeconds: 300)
        func hops(_ headers: [String: String]) -> [String] {
            f.outboundRequest(for: HTTPRequest(method: "GET", path: "/", headers: headers), base: "http://h").headers
                .filter { $0.0.lowercased() == Forwarder.hopsHeader }.map(\.1)
        }
        #expect(hops([:]) == ["1"])
        #expect(hops([Forwarder.header: "b"]) == ["2"])
        #expect(hops([Forwarder.header: "b", Forwarder.hopsHeader: "1"]) == ["2"])
        // Without the forwarded-by mark a count means nothing (a client's): the first hop.
        #expect(hops([Forwarder.hopsHeader: "7"]) == ["1"])
        #expect(hops([Forwarder.header: "b", Forwarder.hopsHeader: "99999999999999999999"]) == ["2"])
    }
}

@Suite("GET /v1/workers across instances: every instance's page, merged")
struct MergeWorkersTests {
    static func page(_ workers: [(String, [(op: String, since: String)])], next: String?) -> HTTPResponse {
        let list = workers.map { w, leases in
            let ls = leases.map { #"{"operation":"\#($0.op)","queue":"q","since":"\#($0.since)","expiresAt":"2026-01-01T00:10:00Z"}"# }
            return #"{"worker":"\#(w)","since":"\#(leases.map(\.since).min() ?? "")","leases":[\#(ls.joined(separator: ","))]}"#
        }
        let body = #"{"workers":[\#(list.joined(separator: ","))],"next":\#(next.map { "\"\($0)\"" } ?? "null")}"#
        return HTTPResponse(status: 200, headers: [], body: Array(body.utf8))
    }

    static func names(_ r: HTTPResponse?) -> (workers: [String], leases: [String: [String]], next: String?) {
        guard let r, let v = try? JSONValue.parse(r.body), case let .array(ws)? = v["workers"] else { return ([], [:], "?") }
        var leases: [String: [String]] = [:]
        let workers = ws.compactMap { w -> String? in
            guard case let .string(n)? = w["worker"] else { return nil }
            if case let .array(ls)? = w["leases"] {
                leases[n] = ls.compactMap { if case let .string(op)? = $0["operation"] { return op } else { return nil } }
            }
            return n
        }
        if case let .string(n)? = v["next"] { return (workers, leases, n) }
        return (workers, leases, nil)
    }

    @Test("one worker's leases on two instances are one entry, oldest first; a page cut short limits the merge")
    func merges() {
        let a = Self.page([("w1", [("op-2", "2026-01-01T00:00:02Z")]), ("w3", [("op-5", "2026-01-01T00:00:05Z")])], next: nil)
        let b = Self.page([("w1", [("op-1", "2026-01-01T00:00:01Z")]), ("w2", [("op-3", "2026-01-01T00:00:03Z")])], next: "w2")
        let merged = Self.names(WorkersController.mergeWorkers([a, b], budget: 1 << 20))
        #expect(merged.workers == ["w1", "w2"], "w3 lies past b's page, which was cut at w2")
        #expect(merged.leases["w1"] == ["op-1", "op-2"])
        #expect(merged.next == "w2")
        let whole = Self.names(WorkersController.mergeWorkers([a, Self.page([("w2", [("op-3", "2026-01-01T00:00:03Z")])], next: nil)], budget: 1 << 20))
        #expect(whole.workers == ["w1", "w2", "w3"] && whole.next == nil)
        let small = Self.names(WorkersController.mergeWorkers([a], budget: 10))
        #expect(small.workers == ["w1"] && small.next == "w1", "cut again at the byte budget")
        #expect(WorkersController.mergeWorkers([HTTPResponse(status: 200, headers: [], body: Array("nope".utf8))], budget: 100) == nil)
    }
}
