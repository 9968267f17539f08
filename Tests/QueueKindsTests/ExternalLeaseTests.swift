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
    }
}
