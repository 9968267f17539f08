import Dispatch
import Foundation
import QueueEngine
import StoreKit
import Testing

/// One suite for every store, as River's `riverdrivertest` exercises every driver: each
/// scenario runs on SQLite and on PostgreSQL (OPQD_TEST_POSTGRES_URL; scripts/test.sh runs the
/// suite in its PostgreSQL step, and the PostgreSQL leg fails without a server), and on the
/// memory store where `DurableStore`'s contract says what it answers (it keeps no events, no
/// idempotency records, nothing across a restart). Where the stores legitimately differ, the
/// test says so per store. `StorePlace` opens a fresh store of each kind, and the same one again
/// for a restart. This file: round trips and reads; the other topics are `StoreConformanceTests+*.swift`.
@Suite("StoreConformanceTests: every store answers alike (memory where its contract says, SQLite, PostgreSQL)")
struct StoreConformanceTests {
    /// Meta values: written in one commit, read by prefix in key order, deleted with nil.
    @Test(arguments: StoreKind.allCases)
    func metaIsWrittenInOneCommitAndReadByPrefixInKeyOrder(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.open()
            _ = try store.recoverState()
            #expect(store.commitMeta([("c:2", "two"), ("c:1", "one"), ("d:1", "other")]))
            #expect(store.meta(prefix: "c:").map { "\($0.key)=\($0.value)" } == ["c:1=one", "c:2=two"])
            #expect(store.commitMeta([("c:1", nil), ("c:2", "2")]))
            #expect(store.meta(prefix: "c:").map { "\($0.key)=\($0.value)" } == ["c:2=2"])
            #expect(store.meta(prefix: "nothing:").isEmpty)
        }
    }

    /// An operation's history: its events after a seq, oldest first, at most a limit; none is
    /// empty, not unknown. The memory store keeps none: nil, and the caller reads its ring.
    @Test(arguments: StoreKind.allCases)
    func anOperationsHistoryIsItsEventsAfterASeqOldestFirst(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.open()
            _ = try store.recoverState()
            let events = [event(1, 1), event(2, 2), event(3, 1), event(4, 1)]
            #expect(
                store.commit(
                    [.queue(queueSnapshot("q")), .operation(operationSnapshot(1)), .operation(operationSnapshot(2))] + events.map { .event($0) }, ticket: 1))
            guard store.isDurable else {
                #expect(store.history(of: OperationID(raw: 1), after: 0, limit: 10) == nil)
                #expect(store.recentEvents(limit: 10).isEmpty)
                return
            }
            #expect(store.history(of: OperationID(raw: 1), after: 0, limit: 10)?.map(\.seq) == [1, 3, 4])
            #expect(store.history(of: OperationID(raw: 1), after: 1, limit: 10)?.map(\.seq) == [3, 4])
            #expect(store.history(of: OperationID(raw: 1), after: 0, limit: 2)?.map(\.seq) == [1, 3])
            #expect(store.history(of: OperationID(raw: 1), after: 4, limit: 10) == [])
            #expect(store.history(of: OperationID(raw: 99), after: 0, limit: 10) == [], "an operation without events has an empty history")
            #expect(store.history(of: OperationID(raw: 2), after: 0, limit: 10) == [events[1]], "events come back whole")
            #expect(store.recentEvents(limit: 2) == Array(events.suffix(2)))
            #expect(store.recentEvents(limit: 10) == events)
        }
    }

    /// An event window of a queue or an operation: after < seq <= through, at most a limit of
    /// rows. The memory store keeps none: nil.
    @Test(arguments: StoreKind.allCases)
    func anEventWindowHoldsTheEventsAfterASeqThroughAnother(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.open()
            _ = try store.recoverState()
            let events = [event(1, 1), event(2, 2, queue: "r"), event(3, 1), event(4, 3)]
            let records: [StoreRecord] =
                [
                    .queue(queueSnapshot("q")), .queue(queueSnapshot("r")), .operation(operationSnapshot(1)),
                    .operation(operationSnapshot(2, queue: "r")), .operation(operationSnapshot(3)),
                ] + events.map { .event($0) }
            #expect(store.commit(records, ticket: 1))
            guard store.isDurable else {
                #expect(store.eventWindow(queue: "q", operation: nil, after: 0, through: 4, limit: 10) == nil)
                return
            }
            let q = try #require(store.eventWindow(queue: "q", operation: nil, after: 0, through: 4, limit: 10))
            #expect(q.events.map(\.seq) == [1, 3, 4])
            let op = try #require(store.eventWindow(queue: nil, operation: OperationID(raw: 1), after: 1, through: 4, limit: 10))
            #expect(op.events.map(\.seq) == [3])
            let through = try #require(store.eventWindow(queue: "q", operation: nil, after: 0, through: 3, limit: 10))
            #expect(through.events.map(\.seq) == [1, 3])
            let empty = try #require(store.eventWindow(queue: "q", operation: nil, after: 4, through: 4, limit: 10))
            #expect(empty.events.isEmpty)
        }
    }
}
