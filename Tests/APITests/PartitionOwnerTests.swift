import Dispatch
import Foundation
import Locking
import Logging
import PostgresStore
import QueueEngine
import Synchronization
import TestKit
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// A kind whose runs end when the test says so.
final class HeldKind: OperationKind {
    private let runs = Locking.Lock<[OperationID: ExecutionContext]>([:])
    let starts = Atomic<Int>(0)
    func start(_ context: ExecutionContext) {
        starts.add(1, ordering: .relaxed)
        runs.withLock { $0[context.operation] = context }
    }
    func cancel(_ context: ExecutionContext) { runs.withLock { $0[context.operation] = nil } }
    func pause(_ context: ExecutionContext) {}
    /// Like `http` and `command`: a run that was under way when its queue moved starts again.
    func recover(_ operation: OperationSnapshot) -> Recovery { .retry }
    func isRunning(_ id: OperationID) -> Bool { runs.withLock { $0[id] != nil } }
    func finish(_ id: OperationID) -> Bool {
        guard let c = runs.withLock({ $0.removeValue(forKey: id) }) else { return false }
        c.finish(.succeeded(.null))
        return true
    }
}

/// One cluster instance without its HTTP server: membership, a store fenced by partition, an
/// engine, the feed read back from PostgreSQL, and its `PartitionOwner`.
final class PartitionedInstance: @unchecked Sendable {
    let id: String
    let store: PostgresStore
    let engine: QueueEngine
    let owner: PartitionOwner
    let kind = HeldKind()
    let lostReason = Locking.Lock<String?>(nil)
    private let seen = Locking.Lock<UInt64>(0)
    var listener: PGListener?
    let background = BackgroundServices()

    init(url: String, id: String, lease: Double) throws {
        self.id = id
        let membership = try PGMembership(url: url, instanceID: id, leaseSeconds: lease)
        let held = PartitionEpochs()
        let lostReason = self.lostReason
        store = try PostgresStore(
            url: url, fence: PGFence(instance: id, epoch: 0, leaseSeconds: lease, partitions: held),
            onFenced: {
                lostReason.withLock { $0 = $0 ?? "fenced" }
            })
        owner = PartitionOwner(
            membership: membership, store: store, held: held, token: "t-\(id)", logger: Logger(label: "test.\(id)"),
            lost: { reason in lostReason.withLock { $0 = $0 ?? reason } })
        let owner = owner
        engine = QueueEngine(
            kinds: ["held": kind], store: store,
            configuration: EngineConfiguration(startAfterCommit: true, mayStart: { owner.mayAct }))
        let (store, seen) = (store, seen)
        let feed = FeedTail(
            logger: Logger(label: "test.feed"), read: { after, limit in try store.events(after: after, limit: limit) },
            lastSeq: { seen.withLock { $0 } }
        ) { batch in
            let fresh = seen.withLock { s -> [ChangeEvent] in
                let f = batch.filter { $0.seq > s }
                if let last = f.last { s = last.seq }
                return f
            }
            owner.eventsPublished(fresh)
        }
        listener = feed.listen(notifiedAt: url)
        background.start([feed.service])
    }

    func start() throws { try owner.start(engine: engine, advertise: "http://127.0.0.1:1/\(id)") }

    func stop() {
        listener?.stop()
        background.stopAll()
        owner.stop()
        store.close()
    }

    /// As a kill -9 would leave it for the others: nothing given up, nothing more written.
    func crash() {
        listener?.stop()
        background.stopAll()
        owner.abandon()
        store.close()
    }
}

/// The partitioned cluster's core on a real PostgreSQL, two instances in one process
/// (scripts/test.sh runs it with the PostgreSQL suites).
@Suite("PartitionOwnerTests: a partitioned cluster's core on a real PostgreSQL", .serialized)
struct PartitionOwnerTests {
    /// Instances "inst-a" then "inst-b" on `url` (lease 2), started, and b's rendezvous share
    /// once b serves it and a none of it. The caller stops them.
    static func split(_ url: String) throws -> (a: PartitionedInstance, b: PartitionedInstance, bTargets: Set<Int>) {
        let a = try PartitionedInstance(url: url, id: "inst-a", lease: 2)
        try a.start()
        let b: PartitionedInstance
        do {
            b = try PartitionedInstance(url: url, id: "inst-b", lease: 2)
            try b.start()
        } catch {
            a.stop()
            throw error
        }
        let bTargets = QueuePartitions.targets(of: "inst-b", among: ["inst-a", "inst-b"])
        #expect(waitUntil(timeout: 15) { b.owner.servingPartitions == bTargets && a.owner.servingPartitions.isDisjoint(with: bTargets) })
        return (a, b, bTargets)
    }

    /// Issue 24: a claim whose load of queues takes longer than the lease does not stop the
    /// heartbeat and the renewals of the partitions already held.
    @Test func aLoadLongerThanTheLeaseDoesNotDelayTheRenewals() throws {
        let url = try TestPostgres.createDatabase()
        defer { TestPostgres.dropDatabase(url) }
        let (a, b, bTargets) = try Self.split(url)
        defer { a.stop() }
        // b leaves: a takes its partitions back, and reading their queues takes 3 s (> lease).
        let loads = Locking.Lock(0)
        a.owner.beforeLoading {
            loads.withLock { $0 += 1 }
            Thread.sleep(forTimeInterval: 3)
        }
        b.stop()
        #expect(waitUntil(timeout: 10) { loads.value > 0 }, "a claims b's partitions back")
        var expired: [String] = []
        let until = monotonicSeconds() + 3
        while monotonicSeconds() < until {
            let n =
                (try? TestPostgres.psql(url, "SELECT count(*) FROM opqd.ownership WHERE instance = 'inst-a' AND expires_at < now() AND NOT released")) ?? "?"
            if n != "0" { expired.append(n) }
            Thread.sleep(forTimeInterval: 0.1)
        }
        a.owner.beforeLoading(nil)
        #expect(expired.isEmpty, "leases of a ran out while it loaded: \(expired.prefix(5))")
        #expect(a.lostReason.value == nil)
        #expect(waitUntil(timeout: 10) { a.owner.servingPartitions.count == QueuePartitions.count })
    }

    @Test func twoInstancesSplitThePartitionsDependOnEachOtherAndOneTakesOverWhenTheOtherStops() throws {
        let url = try TestPostgres.createDatabase()
        defer { TestPostgres.dropDatabase(url) }
        do {
            let a = try PartitionedInstance(url: url, id: "inst-a", lease: 2)
            try a.start()
            #expect(a.owner.servingPartitions.count == QueuePartitions.count, "alone, it owns every partition")
            // Queues in every partition, each with an operation running and one waiting behind it.
            let names = (0..<40).map { "q\($0)" }
            var first: [String: OperationID] = [:]
            var second: [String: OperationID] = [:]
            for n in names {
                try a.engine.createQueue(name: n, maxConcurrentOperationCount: 1)
                first[n] = try a.engine.addOperationID(to: n, OperationRequest(kind: "held"))
                second[n] = try a.engine.addOperationID(to: n, OperationRequest(kind: "held"))
            }
            let ticket = a.engine.currentTicket
            let done = DispatchSemaphore(value: 0)
            a.store.whenDurable(ticket) { done.signal() }
            #expect(done.wait(timeout: .now() + 10) == .success)

            let b = try PartitionedInstance(url: url, id: "inst-b", lease: 2)
            try b.start()
            defer { b.stop() }
            let bTargets = QueuePartitions.targets(of: "inst-b", among: ["inst-a", "inst-b"])
            #expect(!bTargets.isEmpty && bTargets.count < QueuePartitions.count)
            #expect(
                waitUntil(timeout: 15) { b.owner.servingPartitions == bTargets && a.owner.servingPartitions.isDisjoint(with: bTargets) },
                "a gives b its partitions and b takes them: a \(a.owner.servingPartitions.count), b \(b.owner.servingPartitions.count)")
            let onB = names.filter { bTargets.contains(QueuePartitions.of(queue: $0)) }
            let onA = names.filter { !bTargets.contains(QueuePartitions.of(queue: $0)) }
            #expect(!onA.isEmpty && !onB.isEmpty)
            // b runs what moved: the running ones again (restart rules of a move), the waiting ones after them.
            for n in onB {
                #expect(throws: EngineError.self) { try a.engine.queue(named: n) }
                let s = try b.engine.operation(first[n] ?? OperationID(raw: 0))
                #expect(s.state == .executing && s.attempt == 2)
                #expect(try b.engine.operation(second[n] ?? OperationID(raw: 0)).state == .ready)
            }
            #expect(waitUntil(timeout: 5) { onB.allSatisfy { b.kind.isRunning(first[$0] ?? OperationID(raw: 0)) } })

            // A dependency across the two: y on b waits for x on a, and starts once x finishes.
            let qa = try #require(onA.first), qb = try #require(onB.first)
            let x = try #require(first[qa])
            let y = try b.engine.addOperationID(to: qb, OperationRequest(kind: "held", dependencies: [x]))
            #expect(y.raw > (second.values.map(\.raw).max() ?? 0), "b's ids come after every id a handed out")
            #expect(try b.engine.operation(y).state == .pending)
            #expect(waitUntil(timeout: 5) { a.kind.isRunning(x) })
            #expect(a.kind.finish(x))
            #expect(b.kind.finish(first[qb] ?? OperationID(raw: 0)))
            #expect(waitUntil(timeout: 10) { (try? b.engine.operation(y).state) != .pending }, "x's end reached b through the feed")

            // a stops cleanly: b takes every partition at once and runs a's queues.
            a.stop()
            #expect(waitUntil(timeout: 15) { b.owner.servingPartitions.count == QueuePartitions.count })
            for n in onA { #expect((try? b.engine.queue(named: n)) != nil) }
            #expect(try b.engine.operation(x).state == .finished, "a's committed end stays")
            #expect(a.lostReason.withLock { $0 } == nil && b.lostReason.withLock { $0 } == nil)

            // c joins and takes its share from b; then c crashes (nothing given up): b takes its
            // partitions back once their leases ran out, with what c committed.
            let c = try PartitionedInstance(url: url, id: "inst-c", lease: 2)
            try c.start()
            let cTargets = QueuePartitions.targets(of: "inst-c", among: ["inst-b", "inst-c"])
            #expect(waitUntil(timeout: 15) { c.owner.servingPartitions == cTargets }, "c takes its share")
            let onC = try #require(names.first { cTargets.contains(QueuePartitions.of(queue: $0)) })
            let z = try c.engine.addOperationID(to: onC, OperationRequest(kind: "held"))
            let committed = DispatchSemaphore(value: 0)
            c.store.whenDurable(c.engine.currentTicket) { committed.signal() }
            #expect(committed.wait(timeout: .now() + 10) == .success)
            let crashedAt = DispatchTime.now().uptimeNanoseconds
            c.crash()
            #expect(waitUntil(timeout: 15) { b.owner.servingPartitions.count == QueuePartitions.count })
            let took = Double(DispatchTime.now().uptimeNanoseconds - crashedAt) / 1e9
            print("partitions of a crashed instance taken over after \(took) s (lease 2 s)")
            #expect(took > 1.5 && took < 6, "taken once the 2 s leases ran out: \(took) s")
            #expect((try? b.engine.operation(z)) != nil, "what c acknowledged is kept")
            #expect(b.lostReason.withLock { $0 } == nil)
        }
    }

    @Test func aCascadeReachesDependentsOfOtherOwnersLiveAndAfterATakeover() throws {
        let url = try TestPostgres.createDatabase()
        defer { TestPostgres.dropDatabase(url) }
        let (a, b, bTargets) = try Self.split(url)
        defer { a.stop() }
        let names = (0..<40).map { "q\($0)" }
        let qa = try #require(names.first { !bTargets.contains(QueuePartitions.of(queue: $0)) })
        let qb = try #require(names.first { bTargets.contains(QueuePartitions.of(queue: $0)) })
        try a.engine.createQueue(name: qa)
        try b.engine.createQueue(name: qb)
        let later = OperationOptions(notBefore: Timestamp(nanoseconds: Int64.max))  // never starts by itself
        func done(_ e: QueueEngine, _ id: OperationID) -> OperationSnapshot? {
            guard let s = try? e.operation(id), s.state == .finished else { return nil }
            return s
        }
        /// What the instance changed is committed (as an HTTP answer waits for).
        func durable(_ i: PartitionedInstance) -> Bool {
            let committed = DispatchSemaphore(value: 0)
            i.store.whenDurable(i.engine.currentTicket) { committed.signal() }
            return committed.wait(timeout: .now() + 10) == .success
        }

        // Live: x on a; y on b after x; z on a after y. The cascade from x crosses to b and back.
        let x = try a.engine.addOperationID(to: qa, OperationRequest(kind: "held", options: later))
        #expect(durable(a))
        let y = try b.engine.addOperationID(to: qb, OperationRequest(kind: "held", dependencies: [x]))
        #expect(durable(b))
        let z = try a.engine.addOperationID(to: qa, OperationRequest(kind: "held", dependencies: [y]))
        try a.engine.cancel(x, cascade: true)
        #expect(waitUntil(timeout: 10) { done(a.engine, z) != nil }, "the cascade went a -> b -> a")
        for (e, id) in [(b.engine, y), (a.engine, z)] {
            let s = try e.operation(id)
            #expect(s.outcome == .cancelled && s.startedAt == nil && s.cascadeAt != nil, "\(id): \(s.state) \(String(describing: s.outcome))")
        }
        // Added after the cascade: x counts as finished, as in Foundation.
        let after = try b.engine.addOperationID(to: qb, OperationRequest(kind: "held", dependencies: [x]))
        #expect(waitUntil(timeout: 5) { b.kind.isRunning(after) })

        // A dependency change that would close a cycle through b's queue is refused.
        let p1 = try a.engine.addOperationID(to: qa, OperationRequest(kind: "held", options: later))
        #expect(durable(a))
        let q1 = try b.engine.addOperationID(to: qb, OperationRequest(kind: "held", dependencies: [p1]))
        #expect(durable(b))
        #expect {
            try a.engine.update(p1, dependencies: [q1])
        } throws: { error in
            if case .dependencyCycle = error as? EngineError { return true }
            return false
        }
        #expect(try a.engine.operation(p1).dependencies.isEmpty)

        // The holder of a dependent stops before it hears of the cascade: whoever takes its queue
        // finishes the cascade from the durable mark.
        let x2 = try a.engine.addOperationID(to: qa, OperationRequest(kind: "held", options: later))
        #expect(durable(a))
        let y2 = try b.engine.addOperationID(to: qb, OperationRequest(kind: "held", dependencies: [x2]))
        #expect(durable(b))
        b.crash()
        try a.engine.cancel(x2, cascade: true)
        #expect(waitUntil(timeout: 15) { a.owner.servingPartitions.count == QueuePartitions.count })
        #expect(waitUntil(timeout: 5) { done(a.engine, y2) != nil })
        let s = try a.engine.operation(y2)
        #expect(s.outcome == .cancelled && s.startedAt == nil, "\(s.state) \(String(describing: s.outcome))")
        #expect((try? a.engine.operation(after))?.state == .executing, "the one added after the first cascade is not cancelled by it")
        #expect(a.lostReason.withLock { $0 } == nil)
    }

    @Test func anOperationRunningThroughThreeUncleanStopsInARowIsNotRunAgain() throws {
        let url = try TestPostgres.createDatabase()
        defer { TestPostgres.dropDatabase(url) }
        var serial = 0
        /// A new instance, alone, once it serves every partition (after the last one's leases).
        func next() throws -> PartitionedInstance {
            serial += 1
            let i = try PartitionedInstance(url: url, id: "inst-\(serial)", lease: 1)
            try i.start()
            #expect(waitUntil(timeout: 10) { i.owner.servingPartitions.count == QueuePartitions.count }, "\(i.id) took every partition")
            return i
        }
        func crashes(_ i: PartitionedInstance, _ x: OperationID) -> String? {
            i.store.meta(prefix: "crashes:").first { $0.key == "crashes:\(x)" }?.value
        }
        var current = try next()
        try current.engine.createQueue(name: "q")
        let x = try current.engine.addOperationID(to: "q", OperationRequest(kind: "held"))
        let committed = DispatchSemaphore(value: 0)
        current.store.whenDurable(current.engine.currentTicket) { committed.signal() }
        #expect(committed.wait(timeout: .now() + 10) == .success)
        #expect(current.kind.isRunning(x))
        // kill -9 (1), then a clean stop, which starts the count over.
        current.crash()
        current = try next()
        #expect(waitUntil(timeout: 5) { current.kind.isRunning(x) })
        #expect(crashes(current, x) == "1")
        current.stop()
        current = try next()
        #expect(waitUntil(timeout: 5) { current.kind.isRunning(x) })
        #expect(crashes(current, x) == nil, "a clean handover is not a crash in a row")
        // Three in a row: the third taker fails it instead of running it.
        for n in 1...3 {
            current.crash()
            current = try next()
            if n < 3 {
                #expect(waitUntil(timeout: 5) { current.kind.isRunning(x) }, "run again after unclean stop \(n)")
                #expect(crashes(current, x) == "\(n)")
            }
        }
        defer { current.stop() }
        let s = try current.engine.operation(x)
        #expect(s.state == .finished && s.outcome == .failed, "\(s.state) \(String(describing: s.outcome))")
        #expect(s.error?["type"] == .string("crashed-server"))
        #expect(!current.kind.isRunning(x))
    }
}
