import Locking
import QueueEngine
import QueueKinds
import Testing

extension KindsTests {
    /// Lease expiry on the engine's scheduler, driven by a manual clock: nothing sleeps.
    @Suite("External leases expire on the engine's scheduler")
    struct ExternalLeaseTests {
        let clock = ManualClock()
        let external: ExternalKind
        let engine: QueueEngine

        init() throws {
            external = ExternalKind(clock: clock)
            engine = QueueEngine(kinds: ["external": external], clock: clock, scheduler: clock)
            try engine.createQueue(name: "q")
        }

        /// One claimed operation; `retry` nil takes the kind's default (3 attempts).
        func claimOne(lease seconds: Double, retry: RetryPolicy? = RetryPolicy(maxAttempts: 1, backoff: 0, multiplier: 1)) throws -> ExternalKind.Lease {
            var request = OperationRequest(kind: "external", spec: .object([("lease", .number(seconds))]))
            request.options.retry = retry
            _ = try engine.addOperation(to: "q", request)
            let (lease, _) = external.claim(queue: "q", worker: "w", wait: nil)
            return try #require(lease)
        }

        @Test func aLeaseNobodyHeartbeatsFailsTheAttemptWhenItRunsOut() throws {
            let lease = try claimOne(lease: 1)
            clock.advance(seconds: 0.999)
            #expect(try engine.operation(lease.operation).state == .executing)
            clock.advance(seconds: 0.01)  // the expiry timer is armed 5 ms after the lease's end
            let s = try engine.operation(lease.operation)
            #expect(s.outcome == .failed && s.error?["type"] == .string("lease-expired"))
            #expect(throws: ExternalKind.LeaseError.self) { try external.heartbeat(lease.operation, token: lease.token) }
        }

        @Test func byDefaultAnExpiredLeaseIsOfferedAgainAsTheNextAttempt() throws {
            let lease = try claimOne(lease: 1, retry: nil)
            #expect(try engine.operation(lease.operation).options.retry?.maxAttempts == 3)
            clock.advance(seconds: 1.01)
            let s = try engine.operation(lease.operation)
            #expect(s.outcome == nil && s.attempt == 2, "\(s)")
            let (again, _) = external.claim(queue: "q", worker: "w2", wait: nil)
            #expect(again?.operation == lease.operation)
        }

        @Test func aHeartbeatMovesTheExpiryAndTheFirstTimerDoesNothing() throws {
            let lease = try claimOne(lease: 1)
            clock.advance(seconds: 0.6)
            let extended = try external.heartbeat(lease.operation, token: lease.token)
            #expect(extended.expiresAt == clock.now().adding(seconds: 1))
            clock.advance(seconds: 0.6)  // past the first lease's end
            #expect(try engine.operation(lease.operation).state == .executing)
            clock.advance(seconds: 0.41)
            #expect(try engine.operation(lease.operation).error?["type"] == .string("lease-expired"))
        }

        @Test func aReleasedClaimIsOfferedFirstWithTheSameAttemptAndItsTokenIsDead() throws {
            let first = try claimOne(lease: 30)
            var request = OperationRequest(kind: "external", spec: .object([("lease", .number(30))]))
            request.options.retry = RetryPolicy(maxAttempts: 1, backoff: 0, multiplier: 1)
            let second = try engine.addOperation(to: "q", request).id
            external.release([first])
            #expect(try engine.operation(first.operation).kindState == nil, "the saved lease is cleared")
            let (got, _) = external.claim(queue: "q", worker: "w2", max: 10, isAlive: { true }, wait: nil)
            #expect(got.map(\.operation) == [first.operation, second], "the released one goes first")
            #expect(got.first?.token != first.token)
            #expect(try engine.operation(first.operation).attempt == 1)
            #expect(throws: ExternalKind.LeaseError.self) { try external.heartbeat(first.operation, token: first.token) }
            // Releasing a lease that is no longer current (re-leased since) changes nothing.
            external.release([first])
            #expect(try external.heartbeat(first.operation, token: got[0].token).operation == first.operation)
        }

        @Test func aReleasedClaimOfACancelledOperationIsNotOfferedAgain() throws {
            let first = try claimOne(lease: 30)
            _ = try engine.cancel(first.operation)
            external.release([first])
            let (got, _) = external.claim(queue: "q", worker: "w2", max: 10, isAlive: { true }, wait: nil)
            #expect(got.isEmpty, "\(got.map(\.operation))")
            #expect(try engine.operation(first.operation).outcome == .cancelled)
        }

        @Test func heartbeatsDoNotPileUpTimersAndTheOneTimerFollowsTheExpiry() throws {
            let lease = try claimOne(lease: 1)
            for _ in 0..<50 {
                clock.advance(seconds: 0.1)
                _ = try external.heartbeat(lease.operation, token: lease.token)
            }
            #expect(clock.pendingTimers <= 2, "\(clock.pendingTimers) timers pending")
            clock.advance(seconds: 0.99)
            #expect(try engine.operation(lease.operation).state == .executing)
            clock.advance(seconds: 0.03)
            #expect(try engine.operation(lease.operation).error?["type"] == .string("lease-expired"))
        }

        @Test func aWaiterWhoseClientLeftIsSkipped() throws {
            let gone = Lock(false), delivered = Lock<[String]>([])
            let dropped = Lock(0)
            _ = external.claim(
                queue: "q", worker: "gone", max: 1, isAlive: { false }, drop: { dropped.withLock { $0 += 1 } }, wait: { _ in gone.withLock { $0 = true } })
            _ = external.claim(queue: "q", worker: "here", max: 1, isAlive: { true }, wait: { l in delivered.withLock { $0.append(l.worker) } })
            _ = try claimOneQueued()
            #expect(gone.withLock { $0 } == false)
            #expect(delivered.withLock { $0 } == ["here"])
            #expect(dropped.withLock { $0 } == 1, "the skipped long poll is ended")
        }

        @Test("claims waiting on queues that left (a handover) are ended at once; those of other queues wait on")
        func waitersOfQueuesThatLeftAreEnded() throws {
            try engine.createQueue(name: "stays")
            let dropped = Lock<[String]>([])
            var waiters: [String: UInt64] = [:]
            for queue in ["q", "stays"] {
                let (got, waiter) = external.claim(
                    queue: queue, worker: "w", max: 1, isAlive: { true }, drop: { dropped.withLock { $0.append(queue) } }, wait: { _ in })
                #expect(got.isEmpty)
                waiters[queue] = waiter
            }
            external.dropWaiters { $0 == "q" }
            #expect(dropped.value == ["q"])
            #expect(waiters["q"].map { external.cancelClaim(queue: "q", waiter: $0) } == false, "gone already")
            #expect(waiters["stays"].map { external.cancelClaim(queue: "stays", waiter: $0) } == true, "still waiting")
        }

        func claimOneQueued() throws -> OperationID {
            var request = OperationRequest(kind: "external", spec: .object([("lease", .number(30))]))
            request.options.retry = RetryPolicy(maxAttempts: 1, backoff: 0, multiplier: 1)
            return try engine.addOperation(to: "q", request).id
        }
    }
}
