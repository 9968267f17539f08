import Dispatch
import Locking
import Logging
import MicroHTTP
import QueueEngine
import QueueKinds
import StoreKit
import TestKit
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// An engine store whose commits are held until the test lets them go.
final class HeldCommits: OperationStore, @unchecked Sendable {
    // @unchecked: `waiting` is touched only under its lock.
    private let waiting = Lock<(open: Bool, done: [@Sendable () -> Void])>((false, []))
    /// Commits waited for and held now.
    var held: Int { waiting.withLock { $0.open ? 0 : $0.done.count } }
    var wantsRecords: Bool { false }
    func append(_ records: [StoreRecord], upTo ticket: UInt64) {}
    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) {
        let now = waiting.withLock { w -> Bool in
            if !w.open { w.done.append(done) }
            return w.open
        }
        if now { done() }
    }
    /// Every commit held so far is done, and later ones are at once.
    func open() {
        let done = waiting.withLock { w -> [@Sendable () -> Void] in
            w.open = true
            defer { w.done = [] }
            return w.done
        }
        for d in done { d() }
    }
    func close() { waiting.withLock { $0.open = false } }
}

@Suite("A claim's answer")
struct ClaimAnswerTests {
    @Test("a claim answers its operations' statuses as handed out, also when their queue moves to another instance before the commit")
    func claimAnsweredAsHandedOut() throws {
        let held = HeldCommits()
        held.open()
        let external = ExternalKind()
        let engine = QueueEngine(kinds: standardKinds(external: external), store: held)
        let store = MemoryStore()
        let instance = InstanceInfo(id: "claims", store: "memory", now: Timestamp(nanoseconds: 0))
        let router = buildRouter(
            engine: engine, events: EventLog(capacity: 16), metrics: Metrics(),
            webhooks: Webhooks(
                logger: Logger(label: "claims"), transport: OutboundWebhookTransport(), scheduler: engine.scheduler, store: store,
                limits: .init(perOperation: 1, perQueue: 1, total: 1), newestSeq: { 0 }),
            external: external, durability: Durability(engine: engine, idempotency: IdempotencyCache(maxKeys: 10, maxBytes: 1 << 16), store: store, retain: 1),
            store: store, lifecycle: Lifecycle(), limits: OpqdConfiguration.Limits(), access: Access(token: nil, readToken: nil), maxBody: 1 << 20,
            instance: instance, serverID: "claims", placement: SingleInstance(instance: instance))
        let api = APIDispatcher(router: router, access: Access(token: nil, readToken: nil)) { _, _ in }
        // A real server: a claim's client must be connected for it to be answered with its leases.
        let server = HTTPServer(configuration: HTTPServerConfiguration(port: 0, threads: 2), handler: { api.handle($0) })
        try server.start()
        defer { server.shutdown(timeout: .seconds(1)) }
        @Sendable func call(_ method: String, _ path: String, _ body: String = "") -> HTTPOutcome {
            HTTPExchange.run(port: server.port, method: method, path: path, body: Array(body.utf8), timeout: 10)
        }
        #expect(call("POST", "/v1/queues", #"{"name":"w"}"#).response?.status == 201)
        for _ in 0..<2 { #expect(call("POST", "/v1/queues/w/operations", #"{"kind":"external"}"#).response?.status == 201) }
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? engine.queue(named: "w"))?.counts[.executing] == 2 })

        for batch in [false, true] {
            // Handed out, its commit held; meanwhile the queue leaves this instance.
            held.close()
            let before = external.leases.count
            let claim = Lock<HTTPOutcome?>(nil)
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                let outcome = call("POST", batch ? "/v1/queues/w/claim?max=1" : "/v1/queues/w/claim")
                claim.withLock { $0 = outcome }
                done.signal()
            }
            // Handed out, its lease saved with the operation and its answer waiting for that
            // commit, which is held.
            #expect(waitUntil(timeout: 5, every: 0.005) { external.leases.count == before + 1 && held.held > 0 })
            #expect(claim.value == nil, "answered before its commit")
            let saved = try engine.queue(named: "w")
            let ops = try engine.operations(in: "w").operations
            engine.release(queues: ["w"])
            held.open()
            #expect(done.wait(timeout: .now() + 5) == .success)
            let answer = try #require(claim.value?.response)
            #expect(answer.status == 200)
            let json = try JSONValue.parse(answer.body)
            var first: JSONValue? = json
            if batch {
                guard case let .array(claims)? = json["claims"], claims.count == 1 else {
                    Issue.record("not one claim: \(String(decoding: answer.body, as: UTF8.self))")
                    return
                }
                first = claims[0]
            }
            guard case let .string(id)? = first?["operation"]?["id"], case .string? = first?["lease"]?["token"] else {
                Issue.record("no operation status or lease in \(String(decoding: answer.body, as: UTF8.self))")
                return
            }
            #expect(ops.contains { $0.id.description == id })
            // Back here for the next round.
            engine.adopt(RecoveredState(queues: [saved], operations: ops), remote: RemoteStates(finished: [:]))
        }
    }

    /// A cluster instance's engine with queue `name` and one external operation (lease 60 s)
    /// claimed by worker w1: the engine, its kind, the operation and its lease.
    static func claimed(in name: String) throws -> (QueueEngine, ExternalKind, OperationSnapshot, ExternalKind.Lease) {
        let store = HeldCommits()
        store.open()
        let external = ExternalKind()
        let a = QueueEngine(kinds: standardKinds(external: external), store: store, configuration: EngineConfiguration(startAfterCommit: true))
        _ = try a.createQueue(name: name)
        let op = try a.addOperation(to: name, OperationRequest(kind: "external", spec: .object([("lease", .number(60))])))
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? a.operation(op.id))?.state == .executing })
        let (lease, _) = external.claim(queue: name, worker: "w1", wait: nil)
        return (a, external, op, try #require(lease))
    }

    /// Moves queue `name` from `a` to a new engine (a handover) and answers it with its kind and
    /// its store, whose commits are let go at once unless `held`.
    static func handOver(_ name: String, from a: QueueEngine, held: Bool = false) throws -> (QueueEngine, ExternalKind, HeldCommits) {
        let saved = try a.queue(named: name)
        let ops = try a.operations(in: name).operations
        a.release(queues: [name])
        let store = HeldCommits()
        if !held { store.open() }
        let external = ExternalKind()
        let b = QueueEngine(kinds: standardKinds(external: external), store: store, configuration: EngineConfiguration(startAfterCommit: true))
        b.adopt(RecoveredState(queues: [saved], operations: ops), remote: RemoteStates(finished: [:]))
        return (b, external, store)
    }

    /// The lease conflict seen once in `ClusterTests.rollingRestart`: a finish held while its
    /// queue moved was served by the new holder the moment it served the queue, before the
    /// commit of the queue's adoption, when its kind (started only after that commit in a
    /// cluster) had not taken the saved lease up yet: 409 "not leased".
    @Test("a worker's lease is known where its queue was adopted at once, before the adoption's commit: its heartbeat and finish are served")
    func leaseTakenUpBeforeCommit() throws {
        let (a, _, op, lease) = try Self.claimed(in: "w")
        let token = lease.token
        // Handed over: the old holder gives the queue up with the lease saved in its operation.
        // The new holder's commits are held: its adoption is not durable yet.
        let (b, externalB, second) = try Self.handOver("w", from: a, held: true)
        let durable = Lock(false)
        b.whenDurable { durable.withLock { $0 = true } }
        #expect(!durable.withLock { $0 }, "the adoption is not durable yet")
        #expect(throws: Never.self, "a heartbeat right after the adoption") { _ = try externalB.heartbeat(op.id, token: token) }
        #expect(externalB.leases.map(\.token) == [token])
        #expect(throws: Never.self, "a finish right after the adoption") { try externalB.finish(op.id, token: token, .succeeded(.null)) }
        second.open()
        #expect(durable.withLock { $0 })
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? b.operation(op.id))?.state == .finished })
        #expect((try? b.operation(op.id))?.outcome == .succeeded)
    }

    @Test("a paused operation's lease is kept where its queue was adopted: its heartbeat sees isPaused, and after the resume its worker finishes it")
    func pausedLeaseTakenUp() throws {
        let (a, _, op, lease) = try Self.claimed(in: "p")
        let token = lease.token
        _ = try a.pause(op.id)
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? a.operation(op.id))?.state == .paused })
        let (b, externalB, _) = try Self.handOver("p", from: a)
        #expect(try b.operation(op.id).state == .paused)
        #expect(throws: Never.self, "a heartbeat of the paused operation") { _ = try externalB.heartbeat(op.id, token: token) }
        #expect(externalB.leases.map(\.token) == [token])
        let (claimed, _) = externalB.claim(queue: "p", worker: "w2", wait: nil)
        #expect(claimed == nil, "a paused operation is not offered to another worker")
        _ = try b.resume(op.id)
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? b.operation(op.id))?.state == .executing })
        #expect(throws: Never.self, "its worker finishes it after the resume") { try externalB.finish(op.id, token: token, .succeeded(.null)) }
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? b.operation(op.id))?.outcome == .succeeded })
    }

    @Test("a lease of an attempt that ended is not taken up by the next attempt after a handover: the next attempt is offered")
    func leaseOfAnEndedAttemptIsNotTakenUp() throws {
        let (a, externalA, op, lease) = try Self.claimed(in: "r")
        let token = lease.token
        // The worker fails attempt 1; attempt 2 is offered (external retries by default).
        try externalA.finish(op.id, token: token, .failed(type: "worker-error", detail: "no"))
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? a.operation(op.id))?.attempt == 2 })
        let (b, externalB, _) = try Self.handOver("r", from: a)
        #expect(externalB.leases.isEmpty, "attempt 1's lease is not taken up")
        let (again, _) = externalB.claim(queue: "r", worker: "w2", wait: nil)
        #expect(again != nil && again?.token != token, "attempt 2 is offered to workers")
        #expect(try b.operation(op.id).attempt == 2)
    }

    @Test("a worker's finish of a paused operation survives a handover: it applies at the resume, with the worker's result")
    func finishWhilePausedSurvivesAHandover() throws {
        let (a, externalA, op, lease) = try Self.claimed(in: "f")
        let token = lease.token
        _ = try a.pause(op.id)
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? a.operation(op.id))?.state == .paused })
        // Answered 200 (its end parked until the resume), then the queue moves.
        try externalA.finish(op.id, token: token, .succeeded(.object([("n", .number(7))])))
        // A save of the lease that comes after (a heartbeat that extended it just before the
        // finish) does not replace the end saved with the operation.
        ExecutionContext.save([(lease.context, .object([("token", .string(token))]))])
        let (b, externalB, _) = try Self.handOver("f", from: a)
        #expect(try b.operation(op.id).state == .paused)
        #expect(externalB.leases.isEmpty, "the lease it finished is not taken up again")
        _ = try b.resume(op.id)
        #expect(waitUntil(timeout: 5, every: 0.005) { (try? b.operation(op.id))?.state == .finished })
        let done = try b.operation(op.id)
        #expect(done.outcome == .succeeded && done.result == .object([("n", .number(7))]) && done.attempt == 1, "\(done)")
    }
}
