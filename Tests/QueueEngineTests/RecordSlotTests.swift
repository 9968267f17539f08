import Locking
import QueueEngine
import TestKit
import Testing

/// Records every `append` with its ticket, and commits only when told (as `ManualStore`).
final class SlotLogStore: OperationStore, @unchecked Sendable {
    private let state = Lock<(appends: [(records: [StoreRecord], ticket: UInt64)], waiters: [(UInt64, @Sendable () -> Void)])>(([], []))
    var wantsRecords: Bool { true }
    func append(_ records: [StoreRecord], upTo ticket: UInt64) { state.withLock { $0.appends.append((records, ticket)) } }
    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) { state.withLock { $0.waiters.append((ticket, done)) } }
    var appends: [(records: [StoreRecord], ticket: UInt64)] { state.withLock { $0.appends } }
    /// Commits every append so far: runs the waiters whose ticket they reach.
    func commitAll() {
        let due = state.withLock { s -> [@Sendable () -> Void] in
            let top = s.appends.map(\.ticket).max() ?? 0
            let due = s.waiters.filter { $0.0 <= top }.map(\.1)
            s.waiters.removeAll { $0.0 <= top }
            return due
        }
        for done in due { done() }
    }

    /// What one append holds, as short labels: `op:<name>`, `queue:<name>`, `event`, `kept:<scope>`.
    static func labels(_ records: [StoreRecord]) -> [String] {
        records.compactMap { r in
            switch r {
            case let .operation(s): "op:" + (s.name ?? "")
            case .queue, .queueDeleted, .event, .batchPartAdded, .limiter, .limiterDeleted, .host, .schedule, .scheduleDeleted, .history: nil
            case let .kept(k): "kept:" + k.scope
            }
        }
    }
}

@Suite("Record slots: a kept answer is handed to the store in the same append as its change")
struct RecordSlotTests {
    static func kept(_ scope: String) -> StoreRecord {
        .kept(IdempotencyRecord(scope: scope, bodyHash: "h", status: 201, headers: [], body: [], createdAt: Timestamp(nanoseconds: 1)))
    }

    func engine() throws -> (QueueEngine, SlotLogStore) {
        let store = SlotLogStore()
        let engine = QueueEngine(kinds: ["manual": ManualKind()], store: store, clock: ManualClock(), scheduler: ManualClock())
        try engine.createQueue(name: "q", isSuspended: true)
        return (engine, store)
    }

    func add(_ engine: QueueEngine, _ name: String) throws {
        _ = try engine.addOperationID(to: "q", OperationRequest(kind: "manual", name: name))
    }

    @Test("the change and its kept answer go in one append; changes before the slot are not held")
    func keptAnswerRidesWithItsChange() throws {
        let (engine, store) = try engine()
        try add(engine, "before")
        let (_, slot) = try engine.withSlot { try add(engine, "a") }
        let held = store.appends.flatMap { SlotLogStore.labels($0.records) }
        #expect(held == ["op:before"], "the slot's change was handed over before its answer: \(held)")
        // Another request's change while the slot is open waits behind it.
        try add(engine, "other")
        #expect(store.appends.flatMap { SlotLogStore.labels($0.records) } == ["op:before"])
        let s = try #require(slot)
        engine.fill(s, with: Self.kept("a"))
        let last = try #require(store.appends.last)
        // One append, so one commit: the change, its answer, and what waited behind them.
        #expect(SlotLogStore.labels(last.records).sorted() == ["kept:a", "op:a", "op:other"])
    }

    @Test("a kept answer names its own change's queue, whatever else shares its append")
    func keptAnswerNamesItsQueue() throws {
        let (engine, store) = try engine()
        try engine.createQueue(name: "other", isSuspended: true)
        let (_, first) = try engine.withSlot { try add(engine, "a") }
        let (_, second) = try engine.withSlot { _ = try engine.addOperationID(to: "other", OperationRequest(kind: "manual", name: "b")) }
        engine.fill(try #require(second), with: Self.kept("b"))
        engine.fill(try #require(first), with: Self.kept("a"))
        engine.keep(Self.kept("none"))
        var queues: [String: String] = [:]
        for case let .kept(k) in store.appends.flatMap(\.records) { queues[k.scope] = k.queue ?? "-" }
        #expect(queues == ["a": "q", "b": "other", "none": "-"])
    }

    @Test("a body that only reads holds nothing and gets no slot")
    func readOnlyBodyHoldsNothing() throws {
        let (engine, store) = try engine()
        let (name, slot) = engine.withSlot { (try? engine.queue(named: "q"))?.name }
        #expect(slot == nil && name == "q")
        try add(engine, "after")
        #expect(store.appends.flatMap { SlotLogStore.labels($0.records) } == ["op:after"])
    }

    @Test("a body that throws after its change closes the slot empty: the change is written, no answer")
    func throwingBodyClosesTheSlot() throws {
        struct Failed: Error {}
        let (engine, store) = try engine()
        #expect(throws: Failed.self) {
            _ = try engine.withSlot {
                try add(engine, "a")
                throw Failed()
            }
        }
        try add(engine, "b")
        #expect(store.appends.flatMap { SlotLogStore.labels($0.records) } == ["op:a", "op:b"])
    }

    @Test("overlapping slots: each answer stays with its own change, whichever is filled first")
    func overlappingSlots() throws {
        let (engine, store) = try engine()
        let (_, first) = try engine.withSlot { try add(engine, "a") }
        let (_, second) = try engine.withSlot { try add(engine, "b") }
        engine.fill(try #require(second), with: Self.kept("b"))
        #expect(store.appends.flatMap { SlotLogStore.labels($0.records) }.isEmpty, "the first slot still holds everything after it")
        engine.fill(try #require(first), with: Self.kept("a"))
        let appended = store.appends.map { SlotLogStore.labels($0.records) }.filter { !$0.isEmpty }
        #expect(appended.flatMap { $0 }.sorted() == ["kept:a", "kept:b", "op:a", "op:b"])
        let a = try #require(appended.firstIndex { $0.contains("op:a") })
        #expect(appended[a].contains("kept:a"), "the answer in the change's append: \(appended)")
        let b = try #require(appended.firstIndex { $0.contains("op:b") })
        #expect(appended[b].contains("kept:b"), "the answer in the change's append: \(appended)")
    }

    @Test("a kept answer with no change has a ticket of its own: whenDurable waits for its commit")
    func keepAloneWaitsForItsCommit() throws {
        let (engine, store) = try engine()
        try add(engine, "a")
        store.commitAll()
        engine.keep(Self.kept("refusal"))
        let answered = Locked(false)
        engine.whenDurable { answered.withLock { $0 = true } }
        #expect(!answered.value, "answered before the kept answer was committed")
        #expect(SlotLogStore.labels(try #require(store.appends.last).records) == ["kept:refusal"])
        store.commitAll()
        #expect(answered.value)
    }
}
