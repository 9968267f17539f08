import Dispatch
import QueueEngine
import Testing

/// Values from clients, workers or a damaged store that used to trap (overflow, `Int(NaN)`)
/// somewhere in the engine. Each test here crashed the test process before its fix.
extension Engine {
    @Suite("No traps on hostile values")
    struct TrapTests {
        @Test("Timestamp arithmetic saturates on huge, infinite and NaN seconds")
        func timestampSaturates() {
            let t = Timestamp(nanoseconds: 1_795_000_000_000_000_000)
            #expect(t.adding(seconds: 1e300).nanoseconds == .max)
            #expect(t.adding(seconds: -1e300).nanoseconds == .min)
            #expect(t.adding(seconds: .infinity).nanoseconds == .max)
            #expect(t.adding(seconds: .nan) == t)
            #expect(Timestamp(nanoseconds: .max).adding(seconds: 1).nanoseconds == .max)
            #expect(Timestamp(nanoseconds: .min).adding(seconds: -1).nanoseconds == .min)
            #expect(Timestamp(seconds: .nan).nanoseconds == 0)
            #expect(Timestamp(seconds: 1e19).nanoseconds == .max)
            #expect(Timestamp(seconds: -.infinity).nanoseconds == .min)
            #expect(Int64(saturating: 9_223_372_036_854_775_807.0) == .max)
            #expect(Int64(saturating: -9_223_372_036_854_775_808.0) == .min)
            #expect(Int64(saturating: -1.5) == -1)
        }

        @Test("RFC 3339 of the extreme timestamps (a damaged store can hold any Int64)")
        func rfc3339Extremes() {
            #expect(Timestamp(nanoseconds: .min).rfc3339.count == 24)
            #expect(Timestamp(nanoseconds: .max).rfc3339.count == 24)
            #expect(Timestamp(nanoseconds: -1).rfc3339 == "1969-12-31T23:59:59.999Z")
            #expect(Timestamp(nanoseconds: -86_400_000_000_000).rfc3339 == "1969-12-31T00:00:00.000Z")
            #expect(Timestamp(nanoseconds: 0).rfc3339 == "1970-01-01T00:00:00.000Z")
        }

        @Test("timer intervals are clamped: NaN and negatives are 0, infinity is capped")
        func timerIntervals() {
            #expect(EngineTimers.interval(seconds: .nan) == .nanoseconds(0))
            #expect(EngineTimers.interval(seconds: -.infinity) == .nanoseconds(0))
            #expect(EngineTimers.interval(seconds: -5) == .nanoseconds(0))
            #expect(EngineTimers.interval(seconds: .infinity) == .nanoseconds(Int(EngineTimers.maxDelaySeconds * 1e9)))
            #expect(EngineTimers.interval(seconds: 1e300) == .nanoseconds(Int(EngineTimers.maxDelaySeconds * 1e9)))
            #expect(EngineTimers.interval(seconds: 1.5) == .nanoseconds(1_500_000_000))
        }

        @Test("a retry backoff that overflows to -infinity or NaN retries at once instead of trapping")
        func retryBackoffOverflow() throws {
            let f = Fixture()
            try f.queue("q")
            // -1e300 s is -inf ns; a NaN backoff stays NaN. Both used to reach `Int(...)`.
            for policy in [
                RetryPolicy(maxAttempts: 3, backoff: -1e300, multiplier: 1e10),
                RetryPolicy(maxAttempts: 3, backoff: .nan, multiplier: 2),
            ] {
                let id = try f.engine.addOperationID(to: "q", OperationRequest(kind: "manual", options: OperationOptions(retry: policy)))
                f.kind.finish(id, .failed(type: "x", detail: "1"))
                f.clock.advance(seconds: 0)  // a backoff of 0: due at once
                #expect(f.kind.calls(.start, for: id).count == 2)
                f.kind.finish(id, .failed(type: "x", detail: "2"))
                f.clock.advance(seconds: 0)
                #expect(f.kind.calls(.start, for: id).count == 3)
                f.kind.finish(id, .succeeded(.null))
                #expect(try f.snapshot(id).outcome == .succeeded)
            }
        }

        @Test("notBefore at the end of time with a clock at the start of it does not overflow")
        func notBeforeExtremes() throws {
            let kind = ManualKind()
            let clock = ManualClock(Timestamp(nanoseconds: -9_000_000_000_000_000_000))
            let engine = QueueEngine(kinds: ["manual": kind], clock: clock, scheduler: clock)
            try engine.createQueue(name: "q")
            let id = try engine.addOperationID(
                to: "q",
                OperationRequest(
                    kind: "manual", options: OperationOptions(notBefore: Timestamp(nanoseconds: .max))))
            #expect(try engine.operation(id).state == .pending)
            clock.advance(seconds: 1e300)  // saturates at the end of time
            #expect(clock.now().nanoseconds == .max)
            #expect(kind.started == [id], "the capped wake-ups re-arm until the end of time, then it starts")
        }

        @Test("restoring out-of-range values (a damaged store) does not trap")
        func restoreHostileValues() throws {
            let kind = ManualKind()
            let clock = ManualClock()
            let engine = QueueEngine(kinds: ["manual": kind], clock: clock, scheduler: clock)
            let q = QueueSnapshot(
                name: "q", maxConcurrentOperationCount: -1, effectiveMaxConcurrentOperationCount: 4,
                isSuspended: false, operationCount: 0, counts: [:], revision: .max,
                createdAt: Timestamp(nanoseconds: .min))
            func op(_ raw: UInt64, state: OperationState, executed: Double, started: Timestamp?, attempt: Int = 1) -> OperationSnapshot {
                OperationSnapshot(
                    id: OperationID(raw: raw), queue: "q", name: nil, kind: "manual", spec: nil, state: state,
                    outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
                    attempt: attempt, result: nil, error: nil, createdAt: Timestamp(nanoseconds: .min),
                    startedAt: started, finishedAt: nil, revision: .max,
                    options: OperationOptions(timeout: .nan, retry: RetryPolicy(maxAttempts: 5, backoff: -.infinity, multiplier: .nan)),
                    executedSeconds: executed)
            }
            let recovered = RecoveredState(
                queues: [q],
                operations: [
                    op(1, state: .executing, executed: .nan, started: Timestamp(nanoseconds: .min)),
                    op(2, state: .executing, executed: 1e300, started: Timestamp(nanoseconds: .min)),
                    op(3, state: .executing, executed: 0, started: Timestamp(nanoseconds: .min)),
                    op(4, state: .ready, executed: -1e300, started: nil),
                    op(UInt64.max, state: .ready, executed: 0, started: nil),
                ], lastSeq: .max)
            engine.restore(recovered)
            #expect(engine.nextSequence < UInt64.max / 2)
            #expect((try? engine.operation(OperationID(raw: .max))) == nil, "an id the engine cannot hold is dropped")
            // The restored operations still work: fail them (retry with a NaN/-inf backoff).
            #expect(kind.started.count == 4, "the three executing ones start a new attempt, the ready one its first")
            for id in [1, 2, 3].map({ OperationID(raw: $0) }) { kind.finish(id, .failed(type: "x", detail: "y")) }
            _ = try engine.queue(named: "q")
            #expect(try engine.operation(OperationID(raw: 1)).json.isEmpty == false)
        }
    }
}

extension OperationSnapshot {
    /// Something that reads every field, as the API's encoder would.
    fileprivate var json: String { "\(id) \(createdAt.rfc3339) \(startedAt?.rfc3339 ?? "-") \(revision) \(executedSeconds)" }
}

extension Engine {
    @Suite("Restore memory")
    struct RestoreSpanTests {
        @Test("restoring one operation with a high id allocates one table slot, not one per purged id")
        func highFirstID() throws {
            let engine = QueueEngine(kinds: ["manual": ManualKind()], clock: ManualClock())
            let q = QueueSnapshot(
                name: "q", maxConcurrentOperationCount: -1, effectiveMaxConcurrentOperationCount: 4,
                isSuspended: false, operationCount: 0, counts: [:], revision: 1, createdAt: Timestamp(nanoseconds: 0))
            // 10^8 operations were created and purged before the restart (the store keeps one).
            let id = OperationID(raw: 100_000_000)
            let op = OperationSnapshot(
                id: id, queue: "q", name: nil, kind: "manual", spec: nil, state: .paused, outcome: nil,
                isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil, attempt: 0,
                result: nil, error: nil, createdAt: Timestamp(nanoseconds: 0), startedAt: nil,
                finishedAt: nil, revision: 1, options: OperationOptions())
            engine.restore(RecoveredState(queues: [q], operations: [op], lastSeq: 5))
            #expect(try engine.operation(id).state == .paused)
            #expect(engine.tableSpan == 1)
            let next = try engine.addOperationID(to: "q", OperationRequest(kind: "manual"))
            #expect(next.raw == id.raw + 1)
            #expect(try engine.operation(next).state != .finished)
            #expect(engine.tableSpan == 2)
        }
    }
}
