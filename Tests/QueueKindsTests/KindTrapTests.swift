import QueueEngine
import QueueKinds
import Testing

/// Specs and kind state read back from a damaged store are not validated again; each of these
/// used to trap (`Int64(1e300)`, `UInt64(-1)`, `Int(inf)`) at the restart.
extension KindsTests {
    @Suite("Kinds do not trap on restored values")
    struct KindTrapTests {
        func executing(_ id: UInt64, kind: String, spec: JSONValue?, kindState: JSONValue? = nil) -> OperationSnapshot {
            OperationSnapshot(
                id: OperationID(raw: id), queue: "q", name: nil, kind: kind, spec: spec, state: .executing,
                outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
                attempt: 1, result: nil, error: nil, createdAt: SystemClock().now(),
                startedAt: SystemClock().now(), finishedAt: nil, revision: 1, options: OperationOptions(),
                executedSeconds: 0, kindState: kindState)
        }

        func restored(_ kinds: [String: any OperationKind], _ ops: [OperationSnapshot], clock: ManualClock? = nil) -> QueueEngine {
            let engine = clock.map { QueueEngine(kinds: kinds, clock: $0, scheduler: $0) } ?? QueueEngine(kinds: kinds)
            let q = QueueSnapshot(
                name: "q", maxConcurrentOperationCount: -1, effectiveMaxConcurrentOperationCount: 4,
                isSuspended: false, operationCount: 0, counts: [:], revision: 1, createdAt: SystemClock().now())
            engine.restore(RecoveredState(queues: [q], operations: ops, lastSeq: 0))
            return engine
        }

        @Test func externalLeaseWithOutOfRangeSavedTimesIsAdoptedNotTrapped() throws {
            let external = ExternalKind()
            let engine = restored(
                ["external": external],
                [
                    executing(
                        1, kind: "external", spec: .object([("lease", .number(1e300))]),
                        kindState: .object([
                            ("token", .string("t1")), ("expiresAt", .number(1e300)), ("worker", .string("w")), ("since", .number(-1e300)),
                        ])),
                    // A huge spec lease without a saved lease: offered again, then claimed.
                    executing(2, kind: "external", spec: .object([("lease", .number(1e300))])),
                ])
            let adopted = try external.lease(OperationID(raw: 1), token: "t1")
            #expect(adopted.expiresAt.nanoseconds == .max)
            #expect(adopted.since.nanoseconds == .min)
            #expect(adopted.since.rfc3339.count == 24)
            let (lease, _) = external.claim(queue: "q", worker: "w2", wait: nil)
            let claimed = try #require(lease)
            #expect(claimed.operation == OperationID(raw: 2))
            // Pinned to the 1-day maximum `validate` allows.
            let left = Double(claimed.expiresAt.nanoseconds - SystemClock().now().nanoseconds) / 1e9
            #expect(left > 86_000 && left <= 86_400)
            _ = try external.heartbeat(OperationID(raw: 2), token: claimed.token)
            try external.finish(OperationID(raw: 2), token: claimed.token, .succeeded(.null))
            #expect(try engine.operation(OperationID(raw: 2)).outcome == .succeeded)
        }

        @Test func externalSavedLeaseWithNaNTimesIsNotTrapped() throws {
            let external = ExternalKind()
            _ = restored(
                ["external": external],
                [
                    executing(
                        1, kind: "external", spec: nil,
                        kindState: .object([
                            ("token", .string("t1")), ("expiresAt", .number(.nan)), ("worker", .string("w")), ("since", .number(.infinity)),
                        ]))
                ])
            // expiresAt NaN -> 0, long past: offered for claiming again.
            let (lease, _) = external.claim(queue: "q", worker: "w2", wait: nil)
            #expect(lease?.operation == OperationID(raw: 1))
        }

        @Test func delayWithAHugeRestoredSpecIsPinned() throws {
            let clock = ManualClock(SystemClock().now())
            let engine = restored(
                ["delay": DelayKind()],
                [
                    executing(1, kind: "delay", spec: .object([("seconds", .number(1e300))])),
                    executing(2, kind: "delay", spec: .object([("seconds", .number(-1e300))])),
                ], clock: clock)
            // The negative one fires at once; the huge one waits (31 days), cancellable.
            clock.advance(seconds: 0)
            #expect(try engine.operation(OperationID(raw: 2)).outcome == .succeeded)
            clock.advance(seconds: DelayKind.maxSeconds - 60)
            #expect(try engine.operation(OperationID(raw: 1)).state == .executing)
            try engine.cancel(OperationID(raw: 1))
            #expect(try engine.operation(OperationID(raw: 1)).outcome == .cancelled)
            clock.advance(seconds: 120)
            #expect(try engine.operation(OperationID(raw: 1)).outcome == .cancelled, "the stopped timer changes nothing")
        }

        @Test func commandRecoverWithADamagedProcessIdentity() {
            let kind = CommandKind(KindsConfiguration())
            for ticks in [-1.0, 1e300, .nan, .infinity] {
                let op = executing(
                    1, kind: "command", spec: nil,
                    kindState: .object([
                        ("pid", .number(Double(Int32.max - 1))), ("startTicks", .number(ticks)), ("bootId", .string("x")),
                    ]))
                #expect(kind.recover(op) == .fail("interrupted"))
            }
        }
    }
}
