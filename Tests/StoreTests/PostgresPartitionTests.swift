import Dispatch
import Foundation
import PostgresStore
import QueueEngine
import SQLiteStore
import Synchronization
import Testing

/// Two queue names in different partitions (`QueuePartitions`), found by trying names.
func queuesInTwoPartitions() -> (String, Int, String, Int) {
    let first = "q0"
    let p = QueuePartitions.of(queue: first)
    var i = 1
    while QueuePartitions.of(queue: "q\(i)") == p { i += 1 }
    return (first, p, "q\(i)", QueuePartitions.of(queue: "q\(i)"))
}

/// A store whose commits are fenced by the partitions `won` (partition -> epoch), counting
/// the commits refused.
final class FencedStore: Sendable {
    let store: PostgresStore
    let fenced = Counter()
    /// `onFenced` is called after the count moves (a test that orders it against other callbacks).
    init(url: String, instance: String, holding won: [Int: Int64], onFenced: @escaping @Sendable () -> Void = {}) throws {
        let held = PartitionEpochs()
        for (p, e) in won { held.set(p, e) }
        let fenced = self.fenced
        store = try PostgresStore(
            url: url, fence: PGFence(instance: instance, epoch: 0, leaseSeconds: 5, partitions: held),
            onFenced: {
                fenced.add()
                onFenced()
            })
    }

    final class Counter: Sendable {
        private let n = Atomic<Int>(0)
        func add() { n.add(1, ordering: .relaxed) }
        var value: Int { n.load(ordering: .relaxed) }
    }
}

/// The partitioned lease rows, the commit fence per partition, blocks of operation ids, and
/// loading some queues: on a real PostgreSQL, with two memberships standing for two instances.
extension PostgresStoreTests {
    @Test func partitionsAreClaimedRenewedReleasedAndTakenOnceTheirLeaseRunsOut() throws {
        try withTestDatabase { url in
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 1)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 1)
            defer { a.close(); b.close() }
            #expect(try a.claim([0, 1, 2], token: "ta") == [0: 1, 1: 1, 2: 1])
            #expect(try b.claim([2, 3], token: "tb") == [3: 1], "a partition held by a live lease is not taken")
            #expect(a.ownsNow)
            #expect(try a.renew([0: 1, 1: 1, 2: 1]) == [0, 1, 2])
            #expect(try b.renew([2: 1, 3: 1]) == [3], "only what it holds is renewed")

            try a.release([2: 1])
            let given = try b.claimNoting([2], token: "tb")
            #expect(given.won == [2: 2], "given up: taken at once, one epoch up")
            #expect(given.abandoned.isEmpty, "given up, not abandoned")
            #expect(try a.renew([0: 1, 1: 1, 2: 1]) == [0, 1], "a renewal tells a it lost partition 2")
            let leases = try a.partitionLeases()
            #expect(leases.map(\.partition) == [0, 1, 2, 3])
            #expect(leases.first { $0.partition == 2 } == PGPartitionLease(partition: 2, instance: "b", epoch: 2, live: true))

            // b stops renewing: its partitions are taken once the lease ran out, not before.
            #expect(try a.claim([3], token: "ta").isEmpty)
            Thread.sleep(forTimeInterval: 1.3)
            _ = try a.renew([0: 1, 1: 1])
            let taken = try a.claimNoting([2, 3, 4], token: "ta")
            #expect(taken.won == [2: 3, 3: 2, 4: 1])
            #expect(taken.abandoned == [2, 3], "b left them to run out; 4 was nobody's")
            #expect(try b.renew([2: 2, 3: 1]).isEmpty)
            // Given back before their queues were taken in (a failed load): the abandoned stay
            // marked so, for whoever takes them next; the others are given up cleanly.
            try a.release([2: 3, 4: 1], abandoned: [2])
            let again = try b.claimNoting([2, 4], token: "tb")
            #expect(again.won == [2: 4, 4: 2])
            #expect(again.abandoned == [2])
        }
    }

    @Test func aOneOwnerLeaseAndPartitionLeasesAreNeverLiveTogether() throws {
        try withTestDatabase { url in
            let one = try PGMembership(url: url, instanceID: "one", leaseSeconds: 5)
            let parts = try PGMembership(url: url, instanceID: "parts", leaseSeconds: 5)
            defer { one.close(); parts.close() }
            let won = try #require(try one.tryAcquire())
            #expect(try parts.claim([0, 1], token: "t").isEmpty, "no partition beside a live one-owner lease (an upgrade in progress)")
            one.release(epoch: won.epoch)
            #expect(try parts.claim([0, 1], token: "t") == [0: 1, 1: 1])
            #expect(try one.tryAcquire() == nil, "no one-owner lease beside live partition leases")
            try parts.release([0: 1, 1: 1])
            #expect(try one.tryAcquire() != nil)
        }
    }

    @Test func blocksOfOperationIDsNeverOverlapAndStartAboveEveryStoredID() throws {
        try withTestDatabase { url in
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 5)
            defer { a.close(); b.close() }
            let first = try a.takeIDBlock()
            let second = try b.takeIDBlock()
            #expect(first.count == 1 << 24 && second.count == 1 << 24)
            #expect(first.lowerBound > 0 && second.lowerBound >= first.upperBound)
            // An id above them written by an older, one-owner opqd (max + 1): the next block is above it.
            try TestPostgres.psql(
                url,
                """
                INSERT INTO opqd.queues VALUES ('old', 1, 1, false, 1, 0);
                INSERT INTO opqd.operations (id, queue, kind, priority, state, is_cancelled, dependencies, attempt, created_at, revision, executed_seconds)
                VALUES (\(second.upperBound + 5), 'old', 'delay', 0, 'pending', false, '{}', 0, 0, 1, 0);
                """)
            let third = try a.takeIDBlock()
            #expect(third.lowerBound > second.upperBound + 5)
            // Concurrent takers never get the same block.
            let blocks = Mutex<[Range<UInt64>]>([])
            DispatchQueue.concurrentPerform(iterations: 8) { i in
                if let r = try? (i % 2 == 0 ? a : b).takeIDBlock() { blocks.withLock { $0.append(r) } }
            }
            let all = blocks.withLock { $0 }.sorted { $0.lowerBound < $1.lowerBound }
            #expect(all.count == 8)
            for (x, y) in zip(all, all.dropFirst()) { #expect(x.upperBound <= y.lowerBound) }
        }
    }

    @Test func aCommitIsFencedByThePartitionsItWritesToAndNoOthers() throws {
        try withTestDatabase { url in
            let (qa, pa, qb, pb) = queuesInTwoPartitions()
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 5)
            defer { a.close(); b.close() }
            let won = try a.claim([pa, pb], token: "ta")
            #expect(won.count == 2)
            let fencedStore = try FencedStore(url: url, instance: "a", holding: won)
            let (store, fenced) = (fencedStore.store, fencedStore.fenced)
            defer { store.close() }
            let engine = QueueEngine(kinds: ["manual": ManualKind()], store: store)
            try engine.createQueue(name: qa)
            try engine.createQueue(name: qb)
            let x = try engine.addOperationID(to: qa, OperationRequest(kind: "manual"))
            #expect(waitDurable(store, engine.currentTicket))
            let epochs = try TestPostgres.psql(url, "SELECT DISTINCT epoch FROM opqd.events WHERE queue = '\(qa)'")
            #expect(epochs == "\(won[pa] ?? -1)", "events carry their partition's epoch")

            // b takes qa's partition (a was cut off past its lease): a's next commit to it is refused.
            try a.release([pa: won[pa] ?? 0])
            #expect(try b.claim([pa], token: "tb") == [pa: (won[pa] ?? 0) + 1])
            try engine.cancel(x)
            let ticket = engine.currentTicket
            #expect(!waitDurable(store, ticket, timeout: 1.5), "nothing of a fenced commit is durable")
            #expect(fenced.value == 1)
            #expect(try TestPostgres.psql(url, "SELECT state FROM opqd.operations WHERE id = \(x.raw)") != "finished")
        }
    }

    @Test func metaWritesAreFencedOnceEveryPartitionHeldWentToAnother() throws {
        try withTestDatabase { url in
            let (_, pa, _, pb) = queuesInTwoPartitions()
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 5)
            defer { a.close(); b.close() }
            let won = try a.claim([pa, pb], token: "ta")
            let fencedStore = try FencedStore(url: url, instance: "a", holding: won)
            let (store, fenced) = (fencedStore.store, fencedStore.fenced)
            defer { store.close() }
            func write(_ key: String) -> Bool {
                let done = DispatchSemaphore(value: 0)
                guard store.setMeta([(key, "1")], then: { done.signal() }) else { return false }
                return done.wait(timeout: .now() + 1.5) == .success
            }
            #expect(write("crashes:1"), "held: written")
            // One partition taken by b while the writer still names it: a still holds the
            // other, and writes.
            let lowest = min(pa, pb), other = max(pa, pb)
            try a.release([lowest: won[lowest] ?? 0])
            _ = try b.claim([lowest], token: "tb")
            #expect(write("crashes:2"), "one partition still held: written")
            // a was cut off past its leases: b holds both. Nothing more of a's is written.
            try a.release([other: won[other] ?? 0])
            _ = try b.claim([other], token: "tb")
            #expect(!write("crashes:3"), "nothing of a fenced meta write is durable")
            #expect(fenced.value == 1)
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.meta WHERE key = 'crashes:3'::bytea") == "0")
        }
    }

    @Test func keptAnswersAreLoadedForThePartitionsTakenOnly() throws {
        try withTestDatabase { url in
            let (qa, pa, qb, _) = queuesInTwoPartitions()
            let store = try PostgresStore(url: url)
            defer { store.close() }
            _ = try store.recoverState()
            func kept(_ key: String, _ queue: String?) -> IdempotencyRecord {
                var r = IdempotencyRecord(scope: "POST /x|\(key)", bodyHash: "h", status: 201, headers: [], body: [], createdAt: Timestamp(nanoseconds: 1))
                r.queue = queue
                return r
            }
            // Kept with a change to qa and one to qb in one append (one commit), and with none.
            store.engineStore.append([.queueDeleted(qb), .queueDeleted(qa), .kept(kept("a", qa)), .kept(kept("b", qb))], upTo: 1)
            store.engineStore.append([.kept(kept("none", nil))], upTo: 3)
            #expect(waitDurable(store.engineStore, 3))
            #expect(Set(store.loadIdempotency(partitions: [pa]).map(\.scope)) == ["POST /x|a", "POST /x|none"])
            #expect(store.loadIdempotency().count == 3)
        }
    }

    @Test func aCommitToAPartitionNotHeldIsRefusedBeforeItReachesTheServer() throws {
        try withTestDatabase { url in
            let (qa, pa, qb, _) = queuesInTwoPartitions()
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            defer { a.close() }
            let won = try a.claim([pa], token: "ta")
            let fencedStore = try FencedStore(url: url, instance: "a", holding: won)
            let (store, fenced) = (fencedStore.store, fencedStore.fenced)
            defer { store.close() }
            let engine = QueueEngine(kinds: ["manual": ManualKind()], store: store)
            try engine.createQueue(name: qa)
            #expect(waitDurable(store, engine.currentTicket))
            try engine.createQueue(name: qb)
            #expect(!waitDurable(store, engine.currentTicket, timeout: 1))
            #expect(fenced.value == 1)
            #expect(try TestPostgres.psql(url, "SELECT name FROM opqd.queues ORDER BY name") == qa)
        }
    }

    /// A commit with events sooner after its writer's last NOTIFY than the spacing sends none,
    /// and is announced by a NOTIFY of its own once the spacing is up (here 2 s, so that the
    /// one held back is seen held back): the other instances' feeds never wait for their
    /// one-second read for it.
    @Test func aCommitSoonAfterItsWritersLastNotifyIsAnnouncedWhenTheSpacingIsUp() throws {
        try withTestDatabase { url in
            let (qa, pa, _, _) = queuesInTwoPartitions()
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            defer { a.close() }
            let fencedStore = try FencedStore(url: url, instance: "a", holding: try a.claim([pa], token: "ta"))
            let store = fencedStore.store
            defer { store.close() }
            store.notifySpacingNanos = 2_000_000_000
            let wakes = Locked(0)
            // Not ignoring "a": this test's listener stands for another instance's.
            let listener = PGListener(url: url) { wakes.withLock { $0 += 1 } }
            listener.start()
            defer { listener.stop() }
            func wait(for n: Int, seconds: Double) -> Bool {
                let deadline = Date().addingTimeInterval(seconds)
                while wakes.value < n && Date() < deadline { usleep(10_000) }
                return wakes.value >= n
            }
            #expect(wait(for: 1, seconds: 5), "the listener connected")
            store.append([.event(event(1, 1, queue: qa))], upTo: 1)
            #expect(waitDurable(store, 1))
            #expect(wait(for: 2, seconds: 5), "the first commit's NOTIFY")
            let sent = Date()
            store.append([.event(event(2, 1, queue: qa))], upTo: 2)
            #expect(waitDurable(store, 2))
            usleep(500_000)
            #expect(wakes.value == 2, "the second commit, within the spacing, sent no NOTIFY of its own")
            #expect(wait(for: 3, seconds: 5), "the second commit announced once the spacing was up")
            #expect(Date().timeIntervalSince(sent) > 1.5)
            #expect(try TestPostgres.psql(url, "SELECT count(*) FROM opqd.events") == "2")
        }
    }

    @Test func someQueuesLoadWithTheStatesOfTheirDependenciesOutsideThem() throws {
        try withTestDatabase { url in
            let store = try PostgresStore(url: url)
            let kind = ManualKind()
            let engine = QueueEngine(kinds: ["manual": kind], store: store)
            try engine.createQueue(name: "a")
            try engine.createQueue(name: "b")
            try engine.createQueue(name: "c")
            let done = try engine.addOperationID(to: "a", OperationRequest(kind: "manual"))
            kind.finish(done)
            let running = try engine.addOperationID(to: "a", OperationRequest(kind: "manual"))
            let waiting = try engine.addOperationID(to: "b", OperationRequest(kind: "manual", dependencies: [done, running]))
            _ = try engine.addOperationID(to: "c", OperationRequest(kind: "manual"))
            let cut = try engine.addOperationID(
                to: "a", OperationRequest(kind: "manual", options: OperationOptions(notBefore: Timestamp(nanoseconds: Int64.max))))
            try engine.cancel(cut, cascade: true)
            let mark = try #require(try engine.operation(cut).cascadeAt)
            #expect(waitDurable(store, engine.currentTicket))
            let (recovered, remote) = try store.load(queues: ["b", "missing"])
            #expect(recovered.queues.map(\.name) == ["b"])
            #expect(recovered.operations.map(\.id) == [waiting])
            #expect(remote == RemoteStates(finished: [done: true, running: false]))
            let states = try store.operationStates([done, running, cut, OperationID(raw: 999_999)])
            #expect(states == RemoteStates(finished: [done: true, running: false, cut: true], cascades: [cut: mark]), "the cascade's mark is durable")
            #expect(try store.load(queues: ["a"]).0.operations.first { $0.id == cut }?.cascadeAt == mark)
            #expect(try store.queueNames() == ["a", "b", "c"])
            store.close()
        }
    }
}
