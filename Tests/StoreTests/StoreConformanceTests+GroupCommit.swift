import Dispatch
import Foundation
import QueueEngine
import StoreKit
import Synchronization
import Testing

/// Group commit, as both writers do it through `GroupCommitQueue`: tickets, waiters, batches.
extension StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func manySmallAppendsShareCommitsAndEveryCallbackFiresOnce(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            let batches = 20_000
            let fired = Locked([Int](repeating: 0, count: batches + 1))
            let all = DispatchSemaphore(value: 0)
            let remaining = Atomic<Int>(batches)
            store.append([.queue(queueSnapshot("q"))], upTo: 0)
            for i in 1...batches {
                let t = UInt64(i)
                store.append([.event(event(t, t)), .operation(operationSnapshot(t))], upTo: t)
                store.whenDurable(t) {
                    fired.withLock { $0[i] += 1 }
                    if remaining.subtract(1, ordering: .relaxed).newValue == 0 { all.signal() }
                }
            }
            // A local file (fsync with sync full) has a minute; a server's round trips, two.
            let seconds: Double = kind == .sqlite ? 60 : 120
            #expect(all.wait(timeout: .now() + seconds) == .success)
            #expect(fired.value.dropFirst().allSatisfy { $0 == 1 })
            let stats = store.stats
            #expect(stats.appends == batches + 1)
            #expect(stats.records == 2 * batches + 1)
            #expect(stats.commits < batches / 10, "group commit should batch: \(stats.commits) commits for \(batches) appends")
            #expect(stats.failures == 0)
            #expect(try store.load().operations.count == batches)
        }
    }

    /// A ticket ahead of the appends waits for them; one already committed (the last one, or one
    /// a later commit passed over) is reported before `whenDurable` returns.
    @Test(arguments: StoreKind.durable)
    func aTicketAheadOfTheAppendsWaitsForThemAndOneCommittedIsReportedAtOnce(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            let fired = Locked(false)
            store.whenDurable(2) { fired.withLock { $0 = true } }
            store.append([.queue(queueSnapshot("a"))], upTo: 1)
            #expect(waitDurable(store, 1))
            #expect(fired.value == false)
            store.append([.queue(queueSnapshot("b"))], upTo: 2)
            #expect(waitDurable(store, 2))
            #expect(fired.value)
            store.append([.queue(queueSnapshot("c"))], upTo: 5)
            #expect(waitDurable(store, 5))
            for ticket: UInt64 in [1, 3, 5] {
                let atOnce = Locked(false)
                store.whenDurable(ticket) { atOnce.withLock { $0 = true } }
                #expect(atOnce.value, "ticket \(ticket): called before whenDurable returned")
            }
        }
    }

    @Test(arguments: StoreKind.durable)
    func closingFromADurabilityCallbackDoesNotDeadlock(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            let closed = DispatchSemaphoreBox()
            store.append([.queue(queueSnapshot("a"))], upTo: 1)
            store.whenDurable(1) {
                store.append([.queue(queueSnapshot("b"))], upTo: 2)
                store.close()
                closed.signal()
            }
            #expect(closed.wait(seconds: 10))
            // The writer commits what was queued, closes, and so lets go of the store (SQLite's
            // file lock as its thread exits; PostgreSQL's lock as the server ends the session, on
            // the server's own time): a new store opens within 1 s, 2 s on PostgreSQL.
            let attempts = kind == .sqlite ? 100 : 200
            var reopened: (any StoreUnderTest)?
            for _ in 0..<attempts where reopened == nil {
                reopened = try? place.openDurable()
                if reopened == nil { usleep(10_000) }
            }
            let again = try #require(reopened)
            #expect(try again.load().queues.map(\.name).contains("a"))
        }
    }

    @Test(arguments: StoreKind.durable)
    func appendsFromSeveralThreadsAllBecomeDurable(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            // The engine appends from one drainer at a time; this only checks the queue is safe.
            let next = Locked<UInt64>(0)
            DispatchQueue.concurrentPerform(iterations: 4) { _ in
                for _ in 0..<500 {
                    next.withLock { t in
                        t += 1
                        store.append([.operation(operationSnapshot(t))], upTo: t)
                    }
                }
            }
            #expect(waitDurable(store, 2000))
            #expect(try store.load().operations.count == 2000)
        }
    }

    @Test(arguments: StoreKind.durable)
    func aBatchOfAThousandOperationsIsOneCommit(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            var records: [StoreRecord] = [.queue(queueSnapshot("q"))]
            for i in 1...1000 as ClosedRange<UInt64> {
                records.append(.operation(operationSnapshot(i)))
                records.append(.event(event(i, i)))
            }
            store.append(records, upTo: 1)
            #expect(waitDurable(store, 1))
            #expect(store.stats.commits == 1)
            #expect(try store.load().operations.count == 1000)
        }
    }
}
