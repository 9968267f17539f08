import Dispatch
import Foundation
import QueueEngine
import SQLiteStore
import Synchronization
import Testing

@Suite struct GroupCommitTests {
    @Test func manySmallAppendsShareCommitsAndEveryCallbackFiresOnce() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path, sync: .full)
            defer { store.close() }
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
            #expect(all.wait(timeout: .now() + 60) == .success)
            let counts = fired.value
            #expect(counts.dropFirst().allSatisfy { $0 == 1 })
            let stats = store.stats
            #expect(stats.appends == batches + 1)
            #expect(stats.records == 2 * batches + 1)
            #expect(stats.commits < batches / 10, "group commit should batch: \(stats.commits) commits for \(batches) appends")
            #expect(stats.failures == 0)
            #expect(try store.load().operations.count == batches)
        }
    }

    @Test func aTicketAlreadyCommittedIsReportedAtOnce() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
            store.append([.queue(queueSnapshot("q"))], upTo: 5)
            #expect(waitDurable(store, 5))
            let fired = Locked(false)
            store.whenDurable(3) { fired.withLock { $0 = true } }
            #expect(fired.value, "called before whenDurable returned")
        }
    }

    @Test func aTicketAheadOfTheAppendsWaitsForThem() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
            let fired = Locked(false)
            store.whenDurable(2) { fired.withLock { $0 = true } }
            store.append([.queue(queueSnapshot("a"))], upTo: 1)
            #expect(waitDurable(store, 1))
            #expect(fired.value == false)
            store.append([.queue(queueSnapshot("b"))], upTo: 2)
            #expect(waitDurable(store, 2))
            #expect(fired.value)
        }
    }

    @Test func closingFromADurabilityCallbackDoesNotDeadlock() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            let closed = DispatchSemaphoreBox()
            store.append([.queue(queueSnapshot("a"))], upTo: 1)
            store.whenDurable(1) {
                store.append([.queue(queueSnapshot("b"))], upTo: 2)
                store.close()
                closed.signal()
            }
            #expect(closed.wait(seconds: 10))
            // The writer thread commits what was queued and closes as it exits.
            var reopened: SQLiteStore?
            for _ in 0..<100 where reopened == nil {
                reopened = try? SQLiteStore(directory: dir.path)
                if reopened == nil { usleep(10_000) }
            }
            let again = try #require(reopened)
            defer { again.close() }
            #expect(try again.load().queues.map(\.name).contains("a"))
        }
    }

    @Test func appendsFromSeveralThreadsAllBecomeDurable() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path, sync: .normal)
            defer { store.close() }
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
}
