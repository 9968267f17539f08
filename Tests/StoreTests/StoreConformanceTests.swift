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
/// test says so per store. The scenarios give events seqs 1, 2, 3… in commit order, which both
/// stores end up with: SQLite keeps the engine's seqs, PostgreSQL numbers events in the commit;
/// what each does with a repeated seq is its own (`RoundTripTests`, `PostgresStoreTests`).
/// `StorePlace` opens a fresh store of each kind, and the same one again for a restart. This
/// file: round trips and reads; the other topics are `StoreConformanceTests+*.swift`.
@Suite("StoreConformanceTests: every store answers alike (memory where its contract says, SQLite, PostgreSQL)")
struct StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func everyFieldSurvivesCloseAndReopen(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let queues = [
                queueSnapshot("alpha", max: 2, effective: 2, suspended: false, revision: 3),
                queueSnapshot("beta", max: -1, effective: 4, suspended: true, revision: 9, createdAt: t0.adding(seconds: 0.5)),
            ]
            var ops = everyKindOfOperation()
            // Strings PostgreSQL's text cannot hold, or that array literals must escape.
            ops[1].name = "nul\u{0}inside, \"quotes\" {braces} \\ NULL"
            ops[2].spec = .object([("s", .string("\u{0}\u{1f}{\"}")), ("NULL", .string("NULL"))])
            let events = everyKindOfEvent()
            let store = try place.openDurable()
            store.append(queues.map { .queue($0) }, upTo: 1)
            store.append(ops.map { .operation($0) }, upTo: 2)
            store.append(events.map { .event($0) }, upTo: 3)
            #expect(waitDurable(store, 3))
            store.close()

            let reopened = try place.openDurable()
            let state = try reopened.load()
            #expect(state.lastSeq == UInt64(events.count))
            #expect(state.operations == ops.sorted { $0.id < $1.id })
            #expect(state.queues.count == 2)
            for (got, want) in zip(state.queues, queues) {
                #expect(got.name == want.name)
                #expect(got.maxConcurrentOperationCount == want.maxConcurrentOperationCount)
                #expect(got.effectiveMaxConcurrentOperationCount == want.effectiveMaxConcurrentOperationCount)
                #expect(got.isSuspended == want.isSuspended)
                #expect(got.revision == want.revision)
                #expect(got.createdAt == want.createdAt)
            }
            // Counts are computed from the stored operations.
            let alpha = try #require(state.queues.first { $0.name == "alpha" })
            #expect(alpha.counts[.pending] == 1 && alpha.counts[.ready] == 1 && alpha.counts[.executing] == 1)
            #expect(alpha.operationCount == 3)
            let beta = try #require(state.queues.first { $0.name == "beta" })
            #expect(beta.counts[.finished] == 3 && beta.counts[.paused] == 1 && beta.operationCount == 1)

            #expect(reopened.recentEvents(limit: 100) == events)
            #expect(reopened.recentEvents(limit: 3) == Array(events.suffix(3)))
            #expect(reopened.history(of: OperationID(raw: 1), after: 0, limit: 100) == events.filter { $0.operation.raw == 1 })
            #expect(reopened.history(of: OperationID(raw: 99), after: 0, limit: 100) == [])
            #expect(reopened.oldestEventSeq == 1)
            let window = try #require(reopened.eventWindow(queue: "beta", operation: nil, after: 0, through: 100, limit: 100))
            #expect(window.events == events.filter { $0.queue == "beta" })
            #expect(window.lastSeq == events.filter { $0.queue == "beta" }.last?.seq)
        }
    }

    @Test(arguments: StoreKind.durable)
    func onlyTheLastSnapshotOfAnOperationIsKept(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            store.append([.queue(queueSnapshot("q", revision: 1))], upTo: 1)
            var op = operationSnapshot(1)
            var records: [StoreRecord] = []
            for r in 1...5 as ClosedRange<UInt64> {
                op.revision = r
                records.append(.operation(op))
            }
            store.append(records, upTo: 2)
            op.revision = 6
            op.state = .executing
            store.append([.operation(op), .queue(queueSnapshot("q", suspended: true, revision: 2))], upTo: 3)
            #expect(waitDurable(store, 3))
            let state = try store.load()
            #expect(state.operations == [op])
            #expect(state.queues.map(\.isSuspended) == [true])
        }
    }

    @Test(arguments: StoreKind.durable)
    func deletingAQueueDeletesItsOperationsAndEventsButNotTheSequence(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            store.append(
                [
                    .queue(queueSnapshot("keep")), .queue(queueSnapshot("gone")),
                    .operation(operationSnapshot(1, queue: "keep")), .event(event(1, 1, queue: "keep")),
                    .operation(operationSnapshot(2, queue: "gone")), .event(event(2, 2, queue: "gone")),
                ], upTo: 1)
            // Deleted and recreated within one batch: the new queue starts empty.
            store.append(
                [
                    .operation(operationSnapshot(3, queue: "gone")), .event(event(3, 3, queue: "gone")),
                    .queueDeleted("gone"), .queue(queueSnapshot("gone", max: 7)),
                ], upTo: 2)
            #expect(waitDurable(store, 2))
            store.close()
            let reopened = try place.openDurable()
            let state = try reopened.load()
            #expect(state.queues.map(\.name) == ["gone", "keep"])
            #expect(state.queues.first?.maxConcurrentOperationCount == 7)
            #expect(state.operations.map(\.id.raw) == [1])
            #expect(reopened.recentEvents(limit: 10).map(\.seq) == [1])
            #expect(state.lastSeq == 3)
        }
    }

    /// An empty store loads empty (SQLite's directory did not exist: the store made it); close
    /// is idempotent, and what is appended after it is dropped: never reported durable, never
    /// stored. The memory store recovers nothing, keeps no events, and waits for nothing: it is
    /// not durable, so no answer waits for a commit.
    @Test(arguments: StoreKind.allCases)
    func anEmptyStoreLoadsEmptyAndCloseIsIdempotent(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            guard kind != .memory else {
                let store = try place.open()
                #expect(try store.recoverState() == nil)
                #expect(store.recentEvents(limit: 10).isEmpty)
                #expect(store.history(of: OperationID(raw: 1), after: 0, limit: 10) == nil)
                store.close()
                store.close()
                store.engineStore.append([.queue(queueSnapshot("late"))], upTo: 2)
                let fired = Locked(false)
                store.engineStore.whenDurable(2) { fired.withLock { $0 = true } }
                #expect(fired.value, "called before whenDurable returned")
                #expect(try place.open().recoverState() == nil)
                return
            }
            let store = try place.openDurable()
            let state = try store.load()
            #expect(state.queues.isEmpty && state.operations.isEmpty && state.lastSeq == 0)
            #expect(store.oldestEventSeq == 1)
            #expect(store.recentEvents(limit: 10).isEmpty)
            store.append([.queue(queueSnapshot("q"))], upTo: 1)
            store.close()
            store.close()
            #expect(store.durableTicket == 1)
            store.append([.queue(queueSnapshot("late"))], upTo: 2)
            let fired = Locked(false)
            store.whenDurable(2) { fired.withLock { $0 = true } }
            #expect(fired.value == false)
            let reopened = try place.openDurable()
            #expect(try reopened.load().queues.map(\.name) == ["q"])
        }
    }

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

    /// A failed read of the stored events is unknown (nil), not "no events": the API answers 503
    /// on both stores, not 200 with an empty history on one of them (the divergence the seams
    /// review found, SEAMS.md §2).
    @Test(arguments: StoreKind.durable)
    func aFailedReadOfTheEventsIsUnknownNotEmpty(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            _ = try store.load()
            let records: [StoreRecord] = [.queue(queueSnapshot("q")), .operation(operationSnapshot(1)), .operation(operationSnapshot(2)), .event(event(1, 2))]
            #expect(store.commit(records, ticket: 1))
            #expect(store.history(of: OperationID(raw: 2), after: 0, limit: 10)?.count == 1, "the sound store reads the event")
            #expect(store.history(of: OperationID(raw: 99), after: 0, limit: 10) == [], "an operation without events has an empty history")
            #expect(store.eventWindow(queue: "q", operation: nil, after: 0, through: 10, limit: 10)?.events.count == 1)
            try place.breakEventReads(of: store)
            #expect(store.history(of: OperationID(raw: 2), after: 0, limit: 10) == nil)
            #expect(store.eventWindow(queue: "q", operation: nil, after: 0, through: 10, limit: 10) == nil)
            #expect(store.events(of: OperationID(raw: 2), after: 0, limit: .max).isEmpty, "events(of:) keeps its empty answer for the callers that want one")
        }
    }
}

/// Operations in every state, with every optional field both set and absent.
func everyKindOfOperation() -> [OperationSnapshot] {
    var ops: [OperationSnapshot] = []
    var pending = operationSnapshot(1, queue: "alpha", state: .pending)
    pending.name = "résumé \"quoted\" \\ line\nbreak 🚀"
    pending.spec = .object([
        ("url", .string("https://example.com/?a=1&b=\u{1}")), ("n", .number(-12.5)), ("big", .number(1e300)),
        ("list", .array([.null, .bool(true), .bool(false), .object([])])), ("empty", .string("")),
    ])
    pending.queuePriority = .veryHigh
    pending.dependencies = [OperationID(raw: 2), OperationID(raw: 3), OperationID(raw: (1 << 62) + 5)]
    pending.options = OperationOptions(
        timeout: 2.5, retry: RetryPolicy(maxAttempts: 3, backoff: 0.25, multiplier: 1.5),
        notBefore: t0.adding(seconds: 60))
    ops.append(pending)

    var ready = operationSnapshot(2, queue: "alpha", state: .ready)
    ready.spec = nil
    ready.kind = "http"
    ready.queuePriority = .veryLow
    ops.append(ready)

    var executing = operationSnapshot(3, queue: "alpha", state: .executing)
    executing.startedAt = t0.adding(seconds: 1)
    executing.attempt = 2
    executing.progress = OperationProgress(completed: 3, total: 10.5)
    executing.kindState = .object([("lease", .string("abc")), ("expires", .number(1_795_000_100))])
    executing.queuePriority = .high
    executing.revision = 7
    ops.append(executing)

    var paused = operationSnapshot(4, queue: "beta", state: .paused)
    paused.spec = .null  // JSON null, not absent
    paused.startedAt = t0.adding(seconds: 2)
    paused.attempt = 1
    paused.executedSeconds = 1.25
    paused.kindState = .array([.number(1), .string("two")])
    paused.queuePriority = .low
    ops.append(paused)

    var succeeded = operationSnapshot(5, queue: "beta", state: .finished)
    succeeded.outcome = .succeeded
    succeeded.startedAt = t0.adding(seconds: 3)
    succeeded.finishedAt = t0.adding(seconds: 4)
    succeeded.attempt = 1
    succeeded.result = .object([("status", .number(200)), ("body", .string("ok"))])
    succeeded.progress = OperationProgress(completed: 1, total: 1)
    ops.append(succeeded)

    var failed = operationSnapshot(6, queue: "beta", state: .finished)
    failed.outcome = .failed
    failed.startedAt = t0.adding(seconds: 5)
    failed.finishedAt = t0.adding(seconds: 6)
    failed.attempt = 3
    failed.error = .object([("type", .string("http-status")), ("detail", .string("503")), ("data", .null)])
    failed.options = OperationOptions(timeout: 0.001, retry: RetryPolicy(maxAttempts: 3, backoff: 1, multiplier: 2))
    ops.append(failed)

    // Beyond 2^53 (exact integers, not doubles), within what the engine hands out (60 bits).
    var cancelled = operationSnapshot((1 << 59) + 5, queue: "beta", state: .finished)
    cancelled.outcome = .cancelled
    cancelled.isCancelled = true
    cancelled.finishedAt = t0.adding(seconds: 7)
    cancelled.name = ""
    cancelled.revision = 1 << 62  // the largest a sound store holds (RecordLimits.maxCounter)
    cancelled.cascadeAt = t0.adding(seconds: 6.5)
    ops.append(cancelled)
    return ops
}

/// One event per key and per kind of value.
func everyKindOfEvent() -> [ChangeEvent] {
    let values: [(ChangeKey, ChangeValue, ChangeValue)] = [
        (.isReady, .none, .bool(false)),
        (.isReady, .bool(false), .bool(true)),
        (.isExecuting, .bool(false), .bool(true)),
        (.isFinished, .bool(false), .bool(true)),
        (.isCancelled, .bool(false), .bool(true)),
        (.isPaused, .bool(true), .bool(false)),
        (.queuePriority, .priority(.veryLow), .priority(.veryHigh)),
        (.queuePriority, .priority(.normal), .priority(.low)),
        (.progress, .none, .progress(OperationProgress(completed: 0.5, total: 3))),
        (.progress, .progress(OperationProgress(completed: 1, total: 2)), .progress(OperationProgress(completed: 2, total: 2))),
        (.attempt, .int(1), .int(2)),
        (.attempt, .int(-3), .int(Int.max)),
    ]
    return values.enumerated().map { i, v in
        event(
            UInt64(i + 1), UInt64(i % 4 + 1), queue: i % 4 < 3 ? "alpha" : "beta", key: v.0, old: v.1, new: v.2,
            state: OperationState.allCases[i % 5])
    }
}
