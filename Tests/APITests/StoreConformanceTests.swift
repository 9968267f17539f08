import Dispatch
import Foundation
import PostgresStore
import QueueEngine
import QueueTesting
import SQLiteStore
import StoreKit
import Testing

@testable import QueueAPI

/// What the API asks of a store (`DurableStore`), asked of every store the same way, as
/// River's driver tests exercise every driver: SQLite and PostgreSQL must answer alike, and the
/// memory store gives the answers its contract documents (it keeps no events and no
/// idempotency records). A first part of the seams issue's conformance suite; the PostgreSQL
/// leg needs OPQD_TEST_POSTGRES_URL (scripts/test.sh sets it) and fails without it.
@Suite("The stores behind the API answer alike (memory, SQLite, PostgreSQL)")
struct StoreConformanceTests {
    enum Choice: String, CaseIterable, Sendable { case memory, sqlite, postgres }

    static let t0 = Timestamp(nanoseconds: 1_795_341_600_000_000_000)

    /// A fresh, empty store of the choice, closed (and its database or directory removed)
    /// afterwards.
    func withStore(_ choice: Choice, _ body: (any DurableStore) throws -> Void) throws {
        switch choice {
        case .memory:
            try body(MemoryStore())
        case .sqlite:
            let dir = try makeTemporaryDirectory(prefix: "opqd-conformance")
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let store = try SQLiteStore(directory: dir)
            defer { store.close() }
            _ = try store.load()
            try body(store)
        case .postgres:
            let url = try TestPostgres.createDatabase()
            defer { TestPostgres.dropDatabase(url) }
            let store = try PostgresStore(url: url)
            defer { store.close() }
            _ = try store.load()
            try body(store)
        }
    }

    /// Appends `records` through the engine's side of the store and waits until durable.
    func commit(_ store: any DurableStore, _ records: [StoreRecord], ticket: UInt64) -> Bool {
        let done = DispatchSemaphore(value: 0)
        store.engineStore.append(records, upTo: ticket)
        store.engineStore.whenDurable(ticket) { done.signal() }
        return done.wait(timeout: .now() + 10) == .success
    }

    func setMeta(_ store: any DurableStore, _ pairs: [(key: String, value: String?)]) -> Bool {
        let done = DispatchSemaphore(value: 0)
        guard store.setMeta(pairs, then: { done.signal() }) else { return false }
        return done.wait(timeout: .now() + 10) == .success
    }

    static func event(_ seq: UInt64, _ op: UInt64, queue: String = "q") -> ChangeEvent {
        ChangeEvent(
            seq: seq, time: t0.adding(seconds: Double(seq)), queue: queue, operation: OperationID(raw: op),
            key: .isReady, old: .none, new: .bool(true), state: .ready)
    }

    static func operation(_ raw: UInt64, queue: String = "q") -> OperationSnapshot {
        OperationSnapshot(
            id: OperationID(raw: raw), queue: queue, name: nil, kind: "delay", spec: .object([("seconds", .number(1))]),
            state: .ready, outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
            attempt: 0, result: nil, error: nil, createdAt: t0, startedAt: nil, finishedAt: nil, revision: 1, options: OperationOptions())
    }

    static func queue(_ name: String) -> QueueSnapshot {
        QueueSnapshot(
            name: name, maxConcurrentOperationCount: -1, effectiveMaxConcurrentOperationCount: 4, isSuspended: false,
            operationCount: 0, counts: [:], revision: 1, createdAt: t0)
    }

    @Test("meta values: written in one commit, read by prefix in key order, deleted with nil", arguments: Choice.allCases)
    func meta(choice: Choice) throws {
        try withStore(choice) { store in
            #expect(setMeta(store, [("c:2", "two"), ("c:1", "one"), ("d:1", "other")]))
            #expect(store.meta(prefix: "c:").map { "\($0.key)=\($0.value)" } == ["c:1=one", "c:2=two"])
            #expect(setMeta(store, [("c:1", nil), ("c:2", "2")]))
            #expect(store.meta(prefix: "c:").map { "\($0.key)=\($0.value)" } == ["c:2=2"])
            #expect(store.meta(prefix: "nothing:").isEmpty)
        }
    }

    @Test("an operation's history: its events after a seq, oldest first, at most a limit; none is empty, not unknown", arguments: Choice.allCases)
    func history(choice: Choice) throws {
        try withStore(choice) { store in
            let events = [Self.event(1, 1), Self.event(2, 2), Self.event(3, 1), Self.event(4, 1)]
            #expect(
                commit(store, [.queue(Self.queue("q")), .operation(Self.operation(1)), .operation(Self.operation(2))] + events.map { .event($0) }, ticket: 1))
            guard store.isDurable else {
                // The memory store keeps none: the caller reads the in-memory ring instead.
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

    @Test("an event window of a queue or an operation: after < seq <= through, at most a limit of rows", arguments: Choice.allCases)
    func eventWindow(choice: Choice) throws {
        try withStore(choice) { store in
            let events = [Self.event(1, 1), Self.event(2, 2, queue: "r"), Self.event(3, 1), Self.event(4, 3)]
            let records: [StoreRecord] =
                [
                    .queue(Self.queue("q")), .queue(Self.queue("r")), .operation(Self.operation(1)), .operation(Self.operation(2, queue: "r")),
                    .operation(Self.operation(3)),
                ] + events.map { .event($0) }
            #expect(commit(store, records, ticket: 1))
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

    @Test("idempotency records: saved whole, loaded back, purged by age", arguments: Choice.allCases)
    func idempotency(choice: Choice) throws {
        try withStore(choice) { store in
            let old = IdempotencyRecord(
                scope: "POST /v1/queues|k1", bodyHash: "h1", status: 201, headers: [("Location", "/v1/queues/a"), ("X", "1")],
                body: Array(#"{"name":"a"}"#.utf8), createdAt: Self.t0)
            let new = IdempotencyRecord(
                scope: "POST /v1/queues|k2", bodyHash: "h2", status: 422, headers: [], body: [0, 1, 2, 255], createdAt: Self.t0.adding(seconds: 100))
            // As the engine hands them over: in a change's records (`StoreRecord.kept`).
            for (i, record) in [old, new].enumerated() {
                let done = DispatchSemaphore(value: 0)
                let ticket = UInt64(i + 1)
                store.engineStore.append([.kept(record)], upTo: ticket)
                store.engineStore.whenDurable(ticket) { done.signal() }
                #expect(done.wait(timeout: .now() + 10) == .success)
            }
            guard store.isDurable else {
                #expect(store.loadIdempotency().isEmpty, "the memory store keeps its cache in memory only")
                #expect(store.purgeIdempotency(before: Self.t0.adding(seconds: 50)) == 0)
                return
            }
            let loaded = store.loadIdempotency().sorted { $0.scope < $1.scope }
            #expect(loaded == [old, new])
            #expect(store.purgeIdempotency(before: Self.t0.adding(seconds: 50)) == 1)
            #expect(store.loadIdempotency() == [new])
        }
    }
}
