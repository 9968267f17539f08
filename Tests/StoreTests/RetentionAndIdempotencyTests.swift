import QueueEngine
import SQLiteStore
import Testing

@Suite struct RetentionTests {
    @Test func purgeRemovesOnlyOldFinishedOperationsAndTheirEvents() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            defer { store.close() }
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
            #expect(store.events(of: OperationID(raw: 5)).isEmpty)
            #expect(store.events(of: OperationID(raw: 1201)).count == 2)
            #expect(store.oldestEventSeq == 2 * 1201 - 1)
            #expect(try store.load().lastSeq == 2 * 1202)
        }
    }
}

@Suite struct IdempotencyTests {
    @Test func savedAnswersComeBackAfterARestart() throws {
        try withTemporaryDirectory { dir in
            let store = try SQLiteStore(directory: dir.path)
            let body: [UInt8] = Array(#"{"id":"op-0000000000000001"}"#.utf8) + [0, 255, 10]
            let done = Locked(0)
            let ready = DispatchSemaphoreBox()
            // Kept answers travel in the records of the change they answer (`StoreRecord.kept`).
            let answer = IdempotencyRecord(
                scope: "POST /v1/queues/q/operations key-1", bodyHash: "sha256:abc", status: 201,
                headers: [("Content-Type", "application/json"), ("Location", "/v1/operations/op-1"), ("X-Quote", "a\"b\\c")],
                body: body, createdAt: SystemClock().now())
            store.append([.kept(answer)], upTo: 1)
            store.whenDurable(1) {
                done.withLock { $0 += 1 }
                ready.signal()
            }
            #expect(ready.wait(seconds: 10))
            store.append(
                [.kept(IdempotencyRecord(scope: "old", bodyHash: "h", status: 200, headers: [], body: [], createdAt: Timestamp(nanoseconds: 1)))],
                upTo: 2)
            store.append(
                [.kept(IdempotencyRecord(scope: "k2", bodyHash: "h2", status: 409, headers: [], body: [], createdAt: SystemClock().now()))], upTo: 3)
            store.close()
            #expect(done.value == 1)

            let reopened = try SQLiteStore(directory: dir.path)
            defer { reopened.close() }
            let saved = reopened.loadIdempotency()
            #expect(saved.map(\.scope) == ["old", "POST /v1/queues/q/operations key-1", "k2"])
            let first = saved[1]
            #expect(first.bodyHash == "sha256:abc" && first.status == 201 && first.body == body)
            #expect(first.headers.map(\.0) == ["Content-Type", "Location", "X-Quote"])
            #expect(first.headers.map(\.1) == ["application/json", "/v1/operations/op-1", "a\"b\\c"])
            #expect(saved[2].body.isEmpty && saved[2].headers.isEmpty)
            #expect(reopened.purgeIdempotency(before: Timestamp(nanoseconds: 2)) == 1)
            #expect(reopened.loadIdempotency().count == 2)
        }
    }
}
