import Locking
import QueueEngine
import Testing

/// A kind whose operations send to the host named by their spec's `host` (what `http` does
/// with its URL), finished by the test with a verdict on that host.
final class HostKind: OperationKind {
    private let log = Locked<[ExecutionContext]>([])
    func host(spec: JSONValue?) -> String? {
        if case let .string(h)? = spec?["host"] { return h }
        return nil
    }
    func start(_ context: ExecutionContext) { log.withLock { $0.append(context) } }
    func cancel(_ context: ExecutionContext) { context.finish(.failed(type: "cancelled", detail: "stopped")) }
    func pause(_ context: ExecutionContext) {}

    var started: [OperationID] { log.value.map(\.operation) }
    func runs(of id: OperationID) -> [ExecutionContext] { log.value.filter { $0.operation == id } }

    func succeed(_ id: OperationID) { runs(of: id).last?.finish(.succeeded(.null), host: .healthy) }
    func fail(_ id: OperationID, _ type: String = "connection-refused") {
        runs(of: id).last?.finish(.failed(type: type, detail: "refused"), host: .failure)
    }
    func throttle(_ id: OperationID, after seconds: Double?) {
        runs(of: id).last?.finish(.failed(type: "http-status", detail: "status 429"), host: .throttle(retryAfter: seconds))
    }
}

/// The breaker per host in the engine, on a manual clock (API.md "Hosts").
extension Engine {
    @Suite struct Hosts {
        struct Setup {
            let engine: QueueEngine
            let kind = HostKind()
            let clock = ManualClock()
            let events: EventLog

            init(failures: Int = 3, open: Double = 5, maxOpen: Double = 300, maxConcurrent: Int = 100) throws {
                var c = EngineConfiguration()
                c.breaker = BreakerSettings(failures: failures, openSeconds: open, maxOpenSeconds: maxOpen)
                engine = QueueEngine(kinds: ["host": kind], store: InMemoryStore(), clock: clock, scheduler: clock, configuration: c)
                events = EventLog(engine)
                try engine.createQueue(name: "q", maxConcurrentOperationCount: maxConcurrent)
            }

            @discardableResult
            func add(_ host: String = "a:80", priority: QueuePriority = .normal, retry: RetryPolicy? = nil, queue: String = "q") throws -> OperationID {
                try engine.addOperationID(
                    to: queue,
                    OperationRequest(kind: "host", queuePriority: priority, spec: .object([("host", .string(host))]), options: OperationOptions(retry: retry)))
            }

            func state(_ host: String = "a:80") throws -> BreakerState { try engine.host(named: host).state }
            var breakerEvents: [String] {
                events.all.filter { $0.key == .breaker }.map { e -> String in
                    if case let .breaker(o) = e.old, case let .breaker(n) = e.new { return "\(e.queue) \(o.rawValue)->\(n.rawValue)" }
                    return "?"
                }
            }
        }

        /// Opens `a:80` with `failures` failed operations.
        func trip(_ s: Setup, failures: Int = 3) throws -> [OperationID] {
            var ids: [OperationID] = []
            for _ in 0..<failures { ids.append(try s.add()) }
            for id in ids { s.kind.fail(id) }
            return ids
        }

        @Test func failuresInARowOpenTheHostAndHoldItsOperations() throws {
            let s = try Setup()
            let first = try trip(s, failures: 2)
            #expect(try s.state() == .closed, "two failures of three do not open it")
            #expect(try s.engine.host(named: "a:80").consecutiveFailures == 2)
            let third = try s.add()
            s.kind.fail(third)
            #expect(try s.state() == .open)
            #expect(s.breakerEvents == ["a:80 closed->open"])
            let held = try (0..<5).map { _ in try s.add() }
            let other = try s.add("b:80")
            #expect(s.kind.started == first + [third, other], "nothing to an open host starts; another host is not held back")
            let h = try s.engine.host(named: "a:80")
            #expect(h.held == 5 && h.openedAt != nil && h.until != nil)
            #expect(h.lastError?["type"] == .string("connection-refused"))
            let w = try s.engine.operation(held[0]).waitingOn ?? []
            #expect(
                w.contains { if case let .host(name, state, until) = $0 { return name == "a:80" && state == "open" && until != nil } else { return false } })
            #expect(try s.engine.operation(held[0]).state == .ready)
        }

        @Test func aFourHundredOrSuccessResetsTheCount() throws {
            let s = try Setup()
            _ = try trip(s, failures: 2)
            let ok = try s.add()
            s.kind.succeed(ok)
            _ = try trip(s, failures: 2)
            #expect(try s.state() == .closed)
            #expect(try s.engine.host(named: "a:80").consecutiveFailures == 2)
        }

        @Test func oneCanaryThenARampOfTwoToTheKPerSecond() throws {
            let s = try Setup(open: 5)
            _ = try trip(s)
            let low = try s.add(priority: .low)
            let held = try (0..<40).map { _ in try s.add() }
            let high = try s.add(priority: .high)
            let before = s.kind.started.count
            s.clock.advance(seconds: 5.6)
            #expect(try s.state() == .halfOpen)
            #expect(s.kind.started.count == before + 1, "one canary")
            #expect(s.kind.started.last == high, "the held one that would start first: priority, then age")
            s.clock.advance(seconds: 30)
            #expect(s.kind.started.count == before + 1, "nothing more while the canary runs")
            s.kind.succeed(high)
            #expect(try s.state() == .ramping)
            #expect(s.kind.started.count == before + 2, "second 0: 2^0 = 1 start")
            #expect(s.kind.started.last == held[0])
            // Wake-ups come a few microseconds after each second's start.
            s.clock.advance(seconds: 0.01)
            s.clock.advance(seconds: 1.0)
            #expect(s.kind.started.count == before + 4, "second 1: 2 more")
            s.clock.advance(seconds: 1.0)
            #expect(s.kind.started.count == before + 8, "second 2: 4 more")
            s.clock.advance(seconds: 1.0)
            #expect(s.kind.started.count == before + 16)
            s.clock.advance(seconds: 1.0)
            #expect(s.kind.started.count == before + 32)
            s.clock.advance(seconds: 1.0)
            #expect(s.kind.started.count == before + 42, "the backlog is gone")
            #expect(s.kind.started.last == low, "the low-priority one last")
            #expect(try s.state() == .closed)
            #expect(s.breakerEvents == ["a:80 closed->open", "a:80 open->halfOpen", "a:80 halfOpen->ramping", "a:80 ramping->closed"])
        }

        @Test func aFailedCanaryOpensItAgainForLonger() throws {
            let s = try Setup(open: 5)
            _ = try trip(s)
            let held = try (0..<3).map { _ in try s.add() }
            let t0 = s.clock.now()
            let first = try #require(try s.engine.host(named: "a:80").until)
            #expect((4.5...5.5).contains(Double(first.nanoseconds - t0.nanoseconds) / 1e9), "5 s ± 10%")
            s.clock.advance(seconds: 5.6)
            s.kind.fail(held[0])
            #expect(try s.state() == .open)
            let t1 = s.clock.now()
            let second = try #require(try s.engine.host(named: "a:80").until)
            #expect((9...11).contains(Double(second.nanoseconds - t1.nanoseconds) / 1e9), "doubled: 10 s ± 10%")
            s.clock.advance(seconds: 11.1)
            s.kind.fail(s.kind.started.last ?? held[1])
            let t2 = s.clock.now()
            let third = try #require(try s.engine.host(named: "a:80").until)
            #expect((18...22).contains(Double(third.nanoseconds - t2.nanoseconds) / 1e9), "doubled again: 20 s ± 10%")
        }

        @Test func theOpenTimeStopsAtItsMaximum() throws {
            let s = try Setup(open: 5, maxOpen: 12)
            _ = try trip(s)
            for _ in 0..<6 { _ = try s.add() }
            for _ in 0..<4 {
                s.clock.advance(seconds: 14)
                let canary = try #require(s.kind.started.last)
                s.kind.fail(canary)
            }
            let t = s.clock.now()
            let until = try #require(try s.engine.host(named: "a:80").until)
            #expect(Double(until.nanoseconds - t.nanoseconds) / 1e9 <= 12 * 1.1)
        }

        @Test func aThrottleHoldsTheHostAndUsesNoAttempt() throws {
            let s = try Setup()
            let op = try s.add(retry: RetryPolicy(maxAttempts: 3, backoff: 1, multiplier: 1))
            let other = try s.add("b:80")
            s.kind.throttle(op, after: 7)
            let snap = try s.engine.operation(op)
            #expect(snap.state == .ready && snap.attempt == 1, "back to ready, the same attempt")
            let h = try s.engine.host(named: "a:80")
            #expect(h.state == .closed && h.throttledUntil != nil)
            #expect(snap.waitingOn?.contains { if case let .host(_, state, _) = $0 { return state == "throttled" } else { return false } } == true)
            let late = try s.add()
            s.clock.advance(seconds: 6.9)
            #expect(s.kind.runs(of: op).count == 1 && s.kind.runs(of: late).isEmpty, "nothing to it before Retry-After")
            #expect(s.kind.runs(of: other).count == 1)
            s.clock.advance(seconds: 0.2)
            #expect(s.kind.runs(of: op).count == 2 && s.kind.runs(of: late).count == 1)
            #expect(s.kind.runs(of: op).last?.attempt == 1)
            let e = s.events.of(op).map(describe)
            #expect(e.contains("isExecuting: true->false") && e.contains("isReady: false->true"))
        }

        @Test func withoutRetryAfterTheWaitDoublesAndTheTwentyFirstCountsAsAnAttempt() throws {
            let s = try Setup()
            let op = try s.add(retry: RetryPolicy(maxAttempts: 2, backoff: 0.01, multiplier: 1))
            var waits: [Double] = []
            for _ in 0..<20 {
                let t = s.clock.now()
                s.kind.throttle(op, after: nil)
                let until = try #require(try s.engine.host(named: "a:80").throttledUntil)
                waits.append(Double(until.nanoseconds - t.nanoseconds) / 1e9)
                s.clock.advance(seconds: 301)
            }
            #expect(Array(waits.prefix(4)) == [1, 2, 4, 8])
            #expect(waits.last == 300, "capped at 300 s")
            #expect(try s.engine.operation(op).attempt == 1)
            s.kind.throttle(op, after: nil)
            let snap = try s.engine.operation(op)
            #expect(snap.attempt == 2, "the 21st in a row is a failed attempt")
        }

        @Test func aRetryDueWhileTheHostIsOpenWaitsHeldWithItsAttempt() throws {
            let s = try Setup()
            let op = try s.add(retry: RetryPolicy(maxAttempts: 5, backoff: 1, multiplier: 1))
            let ids = try (0..<2).map { _ in try s.add() }
            for id in [op] + ids { s.kind.fail(id) }
            #expect(try s.state() == .open)
            s.clock.advance(seconds: 1.1)
            let snap = try s.engine.operation(op)
            #expect(snap.state == .ready && snap.attempt == 2, "held, ready, with the attempt it is at")
            #expect(s.kind.runs(of: op).count == 1)
            s.clock.advance(seconds: 5)
            #expect(s.kind.runs(of: op).count == 2, "it is the canary")
            #expect(s.kind.runs(of: op).last?.attempt == 2)
        }

        @Test func anOperatorOpensClosesAndHandsBack() throws {
            let s = try Setup()
            let until = s.clock.now().adding(seconds: 60)
            try s.engine.setHost("a:80", breaker: .open, until: until, reason: "maintenance")
            let held = try (0..<4).map { _ in try s.add() }
            #expect(s.kind.started.isEmpty)
            let h = try s.engine.host(named: "a:80")
            #expect(h.state == .open && h.manual == HostManual(breaker: .open, until: until, reason: "maintenance") && h.held == 4)
            try s.engine.setHost("a:80", breaker: nil)
            #expect(try s.state() == .halfOpen)
            #expect(s.kind.started == [held[0]], "auto from a hand open goes on as halfOpen: one canary")
            try s.engine.setHost("a:80", breaker: .closed)
            #expect(s.kind.started == held, "closed: at once, no ramp")
            for id in held { s.kind.fail(id) }
            for _ in 0..<3 { s.kind.fail(try s.add()) }
            #expect(try s.state() == .closed, "a host closed by hand does not trip")
            try s.engine.setHost("a:80", breaker: nil)
            for _ in 0..<3 { s.kind.fail(try s.add()) }
            #expect(try s.state() == .open)
        }

        @Test func aHandOpenEndsByItselfAtItsUntil() throws {
            let s = try Setup()
            try s.engine.setHost("a:80", breaker: .open, until: s.clock.now().adding(seconds: 30))
            let op = try s.add()
            s.clock.advance(seconds: 29)
            #expect(s.kind.started.isEmpty)
            s.clock.advance(seconds: 1.1)
            #expect(s.kind.started == [op])
            #expect(try s.engine.host(named: "a:80").manual == nil)
        }

        @Test func anExecutingOperationFinishesItsAttemptWhenTheHostOpens() throws {
            let s = try Setup()
            let running = try s.add()
            _ = try trip(s)
            #expect(try s.engine.operation(running).state == .executing)
            s.kind.succeed(running)
            #expect(try s.engine.operation(running).outcome == .succeeded)
        }

        @Test func cancellingAHeldOperationFinishesIt() throws {
            let s = try Setup()
            _ = try trip(s)
            let held = try s.add()
            try s.engine.cancel(held)
            #expect(try s.engine.operation(held).outcome == .cancelled)
            #expect(try s.engine.host(named: "a:80").held == 0)
        }

        @Test func anOpenHostComesBackOpenAndNothingIsSentAtStart() throws {
            let kind = HostKind()
            let clock = ManualClock()
            let engine = QueueEngine(kinds: ["host": kind], store: InMemoryStore(), clock: clock, scheduler: clock)
            let q = QueueSnapshot(
                name: "q", maxConcurrentOperationCount: 10, effectiveMaxConcurrentOperationCount: 10,
                isSuspended: false, operationCount: 2, counts: [:], revision: 1, createdAt: Timestamp(nanoseconds: 0))
            func op(_ id: UInt64, _ state: OperationState) -> OperationSnapshot {
                OperationSnapshot(
                    id: OperationID(raw: id), queue: "q", name: nil, kind: "host", spec: .object([("host", .string("a:80"))]), state: state,
                    outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil, attempt: state == .executing ? 1 : 0,
                    result: nil, error: nil, createdAt: Timestamp(nanoseconds: 0), startedAt: state == .executing ? Timestamp(nanoseconds: 1) : nil,
                    finishedAt: nil, revision: 1, options: OperationOptions(retry: RetryPolicy(maxAttempts: 5)))
            }
            let host = HostSnapshot(
                host: "a:80", state: .open, openedAt: clock.now(), until: clock.now().adding(seconds: 30), reopenings: 1, revision: 4)
            engine.restore(RecoveredState(queues: [q], operations: [op(1, .executing), op(2, .ready)], lastSeq: 5, hosts: [host]))
            #expect(kind.started.isEmpty, "neither the interrupted attempt nor the backlog is sent to an open host")
            let h = try engine.host(named: "a:80")
            #expect(h.state == .open && h.held == 2 && h.reopenings == 1)
            let interrupted = try engine.operation(OperationID(raw: 1))
            #expect(interrupted.state == .ready && interrupted.attempt == 2)
            clock.advance(seconds: 30.1)
            #expect(kind.started.count == 1, "then one canary")
        }

        @Test func aQueueGivenUpTakesItsOperationsOffItsHostAndItsKeys() throws {
            let s = try Setup()
            try s.engine.createQueue(name: "other", maxConcurrentOperationCount: 10)
            try s.engine.createLimiter(name: "l", settings: LimiterSettings(concurrency: 1))
            try s.engine.setHost("a:80", breaker: .open)
            for _ in 0..<3 { try s.add() }
            let limited = { (q: String) throws -> OperationID in
                try s.engine.addOperationID(to: q, OperationRequest(kind: "host", options: OperationOptions(limits: [LimitRef(limiter: "l")])))
            }
            _ = try limited("q")
            _ = try limited("q")
            let stays = try limited("other")
            #expect(try s.engine.host(named: "a:80").held == 3)
            s.engine.release(queues: ["q"])
            #expect(try s.engine.host(named: "a:80").held == 0, "a queue given up holds nothing on its host")
            let l = try s.engine.limiter(named: "l")
            #expect(l.running == 1 && l.waiting == 0, "the two given up count no more; the one that stays runs")
            #expect(s.kind.started.last == stays, "the key's slot, freed, goes to the operation that stays")
        }

        @Test func unknownHostsAreNotFound() throws {
            let s = try Setup()
            #expect(throws: EngineError.hostNotFound("x:1")) { try s.engine.host(named: "x:1") }
            #expect(s.engine.hosts().isEmpty)
            try s.add("x:1")
            #expect(s.engine.hosts().map(\.host) == ["x:1"])
        }
    }
}
