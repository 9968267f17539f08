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
        _ = try engine.addBarrier(to: "q")
        let firstBarrier = store.appended
        for _ in 0..<4 { _ = try engine.addBarrier(to: "q") }
        let before = seen.withLock { $0 }
        #expect(before.isEmpty, "shown before the commit: \(before)")
        let firstTicket = store.appended
        store.commit(upTo: firstBarrier)
        let partial = seen.withLock { $0 }
        #expect(!partial.isEmpty && partial == Array(1...UInt64(max(1, partial.count))), "a prefix in order: \(partial)")
        store.commit(upTo: firstTicket)
        let all = seen.withLock { $0 }
        #expect(!all.isEmpty)
        #expect(all == Array(1...UInt64(all.count)), "in seq order, each once: \(all)")
    }
}

@Suite("startAfterCommit: kinds act only on committed changes, in the order they were made")
struct StartAfterCommitTests {
    func fixture() throws -> (QueueEngine, ManualKind, ManualStore) {
        let store = ManualStore()
        let kind = ManualKind()
        let clock = ManualClock()
        let engine = QueueEngine(
            kinds: ["manual": kind], store: store, clock: clock, scheduler: clock,
            configuration: EngineConfiguration(startAfterCommit: true))
        try engine.createQueue(name: "q")
        return (engine, kind, store)
    }

    @Test("nothing starts before the commit; start, pause and resume made before one commit run once each, in order")
    func heldUntilCommitInOrder() throws {
        let (engine, kind, store) = try fixture()
        let op = try engine.addOperation(to: "q", OperationRequest(kind: "manual")).id
        #expect(try engine.operation(op).state == .executing)
        #expect(kind.entries.isEmpty, "started before its start was committed")
        _ = try engine.pause(op)
        _ = try engine.resume(op)
        #expect(kind.entries.isEmpty)
        store.commit(upTo: store.appended)
        #expect(kind.entries.map(\.call) == [.start, .pause, .start], "\(kind.entries.map(\.call))")
        #expect(kind.calls(.start, for: op).count == 2 && kind.calls(.start, for: op).last?.isResume == true)
    }

    @Test("a start the owner may not make (mayStart false) is not made")
    func mayStartRefuses() throws {
        let store = ManualStore()
        let kind = ManualKind()
        let allowed = Locked(false)
        let engine = QueueEngine(
            kinds: ["manual": kind], store: store,
            configuration: EngineConfiguration(startAfterCommit: true, mayStart: { allowed.withLock { $0 } }))
        try engine.createQueue(name: "q")
        _ = try engine.addOperation(to: "q", OperationRequest(kind: "manual"))
        store.commit(upTo: store.appended)
        #expect(kind.entries.isEmpty)
    }
}
