import Locking
import QueueEngine
import Testing

/// A store that commits only when told, and calls its durability callbacks in an order the test
/// picks (a real store may call them from several threads in any order).
final class ManualStore: OperationStore, @unchecked Sendable {
    private let state = Lock<(appended: UInt64, waiters: [(UInt64, @Sendable () -> Void)])>((0, []))
    var wantsRecords: Bool { true }
    func append(_ records: [StoreRecord], upTo ticket: UInt64) { state.withLock { $0.appended = ticket } }
    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) { state.withLock { $0.waiters.append((ticket, done)) } }
    var appended: UInt64 { state.withLock { $0.appended } }
    /// Commits everything up to `ticket`, firing the callbacks newest first.
    func commit(upTo ticket: UInt64) {
        let due = state.withLock { s in
            let due = s.waiters.filter { $0.0 <= ticket }
            s.waiters.removeAll { $0.0 <= ticket }
            return due
        }
        for (_, done) in due.reversed() { done() }
    }
}

@Suite("Durable observers see a change only once it is committed")
struct DurableObserverTests {
    @Test("nothing is delivered before the commit; after it, everything in seq order, once")
    func deliveredAfterCommitInOrder() throws {
        let store = ManualStore()
        let engine = QueueEngine(kinds: [:], store: store)
        let seen = Locked<[UInt64]>([])
        engine.observeDurable { batch in seen.withLock { $0.append(contentsOf: batch.map(\.seq)) } }
        try engine.createQueue(name: "q", isSuspended: true)
        for _ in 0..<5 { _ = try engine.addBarrier(to: "q") }
        let before = seen.withLock { $0 }
        #expect(before.isEmpty, "shown before the commit: \(before)")
        let firstTicket = store.appended
        store.commit(upTo: 2)
        let partial = seen.withLock { $0 }
        #expect(partial == Array(1...UInt64(partial.count)), "a prefix in order: \(partial)")
        store.commit(upTo: firstTicket)
        let all = seen.withLock { $0 }
        #expect(!all.isEmpty)
        #expect(all == Array(1...UInt64(all.count)), "in seq order, each once: \(all)")
    }
}
