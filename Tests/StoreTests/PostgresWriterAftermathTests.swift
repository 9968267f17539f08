import Dispatch
import Foundation
import PostgresStore
import QueueEngine
import Synchronization
import Testing

/// Review of baa16de (the PostgreSQL writer's aftermath on a queue of its own), and of 8dbec0d
/// (an idle writer runs it itself).
extension PostgresStoreTests {
    /// A commit that succeeded, then a commit refused by the fence: `onFenced` (which gives the
    /// instance's role up: hand-over, answers cut off after 1 s) must not overtake the
    /// aftermath of the commit before it (its events published, its waiters answered). On the
    /// writer thread it could not: the aftermath ran before the next batch was even sent. Now
    /// `onFenced` is called on the writer thread while that aftermath still waits on
    /// `completions`.
    @Test func aFenceIsReportedOnlyAfterTheCommitsBeforeItAreReportedDurable() throws {
        try withTestDatabase { url in
            let (qa, pa, _, _) = queuesInTwoPartitions()
            let a = try PGMembership(url: url, instanceID: "a", leaseSeconds: 5)
            let b = try PGMembership(url: url, instanceID: "b", leaseSeconds: 5)
            defer { a.close(); b.close() }
            let won = try a.claim([pa], token: "ta")
            let order = Mutex<[String]>([])
            let fencedNow = DispatchSemaphore(value: 0)
            let store = try FencedStore(url: url, instance: "a", holding: won) {
                order.withLock { $0.append("fenced") }
                fencedNow.signal()
            }.store
            defer { store.close() }
            // An idle writer would run the first aftermath itself, and send the next commit
            // only after it: the order would hold by construction. On its queue, it can be
            // overtaken (a busy writer's case).
            store.aftermathRunsOnIdleWriter = false
            // The first commit's aftermath is slow (a feed reading a gap back, a busy answer).
            let entered = DispatchSemaphore(value: 0)
            let gate = DispatchSemaphore(value: 0)
            let first = Atomic<Bool>(true)
            store.onCommittedEvents { _ in
                if first.exchange(false, ordering: .relaxed) {
                    entered.signal()
                    _ = gate.wait(timeout: .now() + 10)
                }
            }
            store.append([.event(event(1, 1, queue: qa))], upTo: 1)
            store.whenDurable(1) { order.withLock { $0.append("durable 1") } }
            #expect(entered.wait(timeout: .now() + 10) == .success, "the first commit committed")
            // b takes the partition: a's next commit is refused.
            try a.release([pa: won[pa] ?? 0])
            #expect(try b.claim([pa], token: "tb") == [pa: (won[pa] ?? 0) + 1])
            store.append([.event(event(2, 2, queue: qa))], upTo: 2)
            _ = fencedNow.wait(timeout: .now() + 2)
            gate.signal()
            _ = fencedNow.wait(timeout: .now() + 5)
            #expect(waitDurable(store, 1))
            #expect(order.withLock { $0 } == ["durable 1", "fenced"])
        }
    }
}
