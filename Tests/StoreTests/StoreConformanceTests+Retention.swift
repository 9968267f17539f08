import QueueEngine
import StoreKit
import Testing

/// What goes away by age (finished operations, kept answers) and what stays across a restart.
extension StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func purgeRemovesOnlyOldFinishedOperationsAndTheirEvents(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            var records: [StoreRecord] = [.queue(queueSnapshot("q"))]
            // 1...1200 finished long ago, 1201 finished recently, 1202 unfinished but old.
            for i in 1...1202 as ClosedRange<UInt64> {
                var op = operationSnapshot(i, state: i <= 1201 ? .finished : .executing)
                if i <= 1201 {
                    op.outcome = .succeeded
                    op.finishedAt = i <= 1200 ? t0.adding(seconds: Double(i)) : t0.adding(seconds: 100_000)
                }
                records.append(.operation(op))
                records.append(.event(event(2 * i - 1, i)))
                records.append(.event(event(2 * i, i, key: .isFinished)))
            }
            store.append(records, upTo: 1)
            #expect(waitDurable(store, 1))
            let cutoff = t0.adding(seconds: 50_000)
            #expect(store.purge(finishedBefore: cutoff, limit: 1000) == 1000)
            // Oldest first: what is left of the old ones are the newest 200.
            var ids = try store.load().operations.map(\.id.raw)
            #expect(ids == Array(1001...1202))
            #expect(store.purge(finishedBefore: cutoff, limit: 1000) == 200)
            #expect(store.purge(finishedBefore: cutoff, limit: 1000) == 0)
            ids = try store.load().operations.map(\.id.raw)
            #expect(ids == [1201, 1202])
            #expect(store.history(of: OperationID(raw: 5), after: 0, limit: 10) == [])
            #expect(store.history(of: OperationID(raw: 1201), after: 0, limit: 10)?.count == 2)
            #expect(store.oldestEventSeq == 2 * 1201 - 1)
            #expect(try store.load().lastSeq == 2 * 1202)
        }
    }

    /// Idempotency records: saved whole, loaded back, purged by age. The memory store keeps its
    /// cache in memory only (the API's), so it loads none and purges none.
    @Test(arguments: StoreKind.allCases)
    func idempotencyRecordsAreSavedWholeAndPurgedByAge(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.open()
            _ = try store.recoverState()
            let old = IdempotencyRecord(
                scope: "POST /v1/queues|k1", bodyHash: "h1", status: 201, headers: [("Location", "/v1/queues/a"), ("X", "1")],
                body: Array(#"{"name":"a"}"#.utf8), createdAt: t0)
            let new = IdempotencyRecord(
                scope: "POST /v1/queues|k2", bodyHash: "h2", status: 422, headers: [], body: [0, 1, 2, 255], createdAt: t0.adding(seconds: 100))
            // As the engine hands them over: in a change's records (`StoreRecord.kept`).
            #expect(store.commit([.kept(old)], ticket: 1))
            #expect(store.commit([.kept(new)], ticket: 2))
            guard store.isDurable else {
                #expect(store.loadIdempotency().isEmpty)
                #expect(store.purgeIdempotency(before: t0.adding(seconds: 50)) == 0)
                return
            }
            #expect(store.loadIdempotency().sorted { $0.scope < $1.scope } == [old, new])
            #expect(store.purgeIdempotency(before: t0.adding(seconds: 50)) == 1)
            #expect(store.loadIdempotency() == [new])
        }
    }

    @Test(arguments: StoreKind.durable)
    func savedAnswersAndMetaComeBackAfterARestart(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            let body: [UInt8] = Array(#"{"id":"op-0000000000000001"}"#.utf8) + [0, 255, 10]
            // Kept answers travel in the records of the change they answer (`StoreRecord.kept`).
            let first = IdempotencyRecord(
                scope: "POST /v1/queues/q/operations\u{0}key-1", bodyHash: "sha256:abc", status: 201,
                headers: [("Content-Type", "application/json"), ("Location", "/v1/operations/op-1"), ("X-Quote", "a\"b\\c\u{0}")],
                body: body, createdAt: t0)
            let old = IdempotencyRecord(scope: "old", bodyHash: "h", status: 200, headers: [], body: [], createdAt: Timestamp(nanoseconds: 1))
            let bare = IdempotencyRecord(scope: "k2", bodyHash: "h2", status: 409, headers: [], body: [], createdAt: t0.adding(seconds: 1))
            let done = Locked(0)
            let ready = DispatchSemaphoreBox()
            store.append([.kept(first)], upTo: 1)
            store.whenDurable(1) {
                done.withLock { $0 += 1 }
                ready.signal()
            }
            store.append([.kept(old)], upTo: 2)
            #expect(store.setMeta([("webhook:a", "{\"x\":\"\u{0}\"}"), ("crashes:1", "2"), ("crashes:2", "1")]) { ready.signal() })
            #expect(ready.wait(seconds: 10) && ready.wait(seconds: 10))
            // Appended and not waited for: close commits what was queued.
            store.append([.kept(bare)], upTo: 3)
            store.close()
            #expect(done.value == 1)

            let reopened = try place.openDurable()
            // Oldest first.
            #expect(reopened.loadIdempotency() == [old, first, bare])
            #expect(reopened.purgeIdempotency(before: Timestamp(nanoseconds: 2)) == 1)
            #expect(reopened.loadIdempotency() == [first, bare])
            #expect(reopened.meta(prefix: "crashes:").map(\.key) == ["crashes:1", "crashes:2"])
            #expect(reopened.meta(prefix: "webhook:").first?.value == "{\"x\":\"\u{0}\"}")
            let deleted = DispatchSemaphoreBox()
            reopened.deleteMeta(prefix: "crashes:") { deleted.signal() }
            #expect(deleted.wait(seconds: 10))
            #expect(reopened.meta(prefix: "crashes:").isEmpty)
            // The prefix is matched as bytes, not as a LIKE pattern.
            #expect(reopened.meta(prefix: "%").isEmpty)
        }
    }
}
