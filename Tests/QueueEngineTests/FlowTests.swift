import QueueEngine
import Testing

/// Flow control in the engine, on a manual clock: queue rates, limiters per key, parking,
/// fairness and `waitingOn` (API.md "Flow control", "Why is it not running?").
extension Engine {
    @Suite struct Flow {
        func add(_ f: Fixture, _ queue: String, limits: [LimitRef] = [], fairness: String? = nil, priority: QueuePriority = .normal) throws -> OperationID {
            try f.engine.addOperationID(
                to: queue, OperationRequest(kind: "manual", queuePriority: priority, options: OperationOptions(limits: limits, fairnessKey: fairness)))
        }

        @Test func queueRateIsATokenBucket() throws {
            let f = Fixture()
            try f.engine.createQueue(name: "q", maxConcurrentOperationCount: 100, rateLimit: RateLimit(perSecond: 2, burst: 3))
            for _ in 0..<20 { _ = try add(f, "q") }
            #expect(f.kind.started.count == 3, "the burst starts at once")
            f.clock.advance(seconds: 0.49)
            #expect(f.kind.started.count == 3)
            f.clock.advance(seconds: 0.02)
            #expect(f.kind.started.count == 4, "one token every half second")
            f.clock.advance(seconds: 4.5)
            #expect(f.kind.started.count == 13, "burst + perSecond × t: 3 + 2 × 5")
            let waiting = try f.engine.operations(in: "q", state: .ready).operations
            #expect(waiting.allSatisfy { $0.waitingOn?.contains { if case .rate = $0 { return true } else { return false } } == true })
        }

        @Test func aBlockedKeyDoesNotStallAnotherAcrossQueues() throws {
            let f = Fixture()
            try f.queue("a", max: 10)
            try f.queue("b", max: 10)
            try f.engine.createLimiter(name: "stripe", settings: LimiterSettings(concurrency: 2))
            var busy: [OperationID] = []
            for i in 0..<6 { busy.append(try add(f, i % 2 == 0 ? "a" : "b", limits: [LimitRef(limiter: "stripe", key: "acct-1")])) }
            let other = try add(f, "a", limits: [LimitRef(limiter: "stripe", key: "acct-2")])
            #expect(f.kind.started == [busy[0], busy[1], other], "acct-1 has 2 slots across both queues; acct-2 is not held back")
            let s = try f.engine.limiter(named: "stripe")
            #expect(s.running == 3 && s.waiting == 4 && s.keys == 2)
            let w = try f.snapshot(busy[2]).waitingOn
            #expect(w == [.limiter(name: "stripe", key: "acct-1", reason: .concurrency, until: nil)])
            f.kind.finish(busy[0])
            #expect(f.kind.started.last == busy[2], "a freed slot lets the oldest parked one go")
            #expect(throws: EngineError.self) { try f.engine.deleteLimiter("stripe") }
            let keys = try f.engine.limiterKeys("stripe").keys
            #expect(keys.map(\.key) == ["acct-1", "acct-2"])
            #expect(keys[0].running == 2 && keys[0].waiting == 3)
        }

        @Test func anOverrideReplacesOneKeysBudget() throws {
            let f = Fixture()
            try f.queue("q", max: 10)
            try f.engine.createLimiter(name: "mail", settings: LimiterSettings(concurrency: 1, overrides: ["vip": LimiterBudget(concurrency: 3)]))
            for _ in 0..<4 { _ = try add(f, "q", limits: [LimitRef(limiter: "mail", key: "vip")]) }
            for _ in 0..<4 { _ = try add(f, "q", limits: [LimitRef(limiter: "mail", key: "std")]) }
            #expect(f.kind.started.count == 4, "3 for vip, 1 for std")
            try f.engine.updateLimiter("mail", concurrency: .some(2))
            #expect(f.kind.started.count == 5, "a wider budget lets a parked one go at once")
        }

        @Test func aKeyRateRefillsByItself() throws {
            let f = Fixture()
            try f.queue("q", max: 100)
            try f.engine.createLimiter(name: "api", settings: LimiterSettings(rate: RateLimit(perSecond: 1, burst: 1)))
            for _ in 0..<5 { _ = try add(f, "q", limits: [LimitRef(limiter: "api", key: "k")]) }
            _ = try add(f, "q")
            #expect(f.kind.started.count == 2, "one token for k; the unlimited one runs")
            f.clock.advance(seconds: 1.01)
            #expect(f.kind.started.count == 3)
            f.clock.advance(seconds: 3.01)
            #expect(f.kind.started.count == 6)
        }

        @Test func oneTenantsFloodDelaysAnotherByAFewStarts() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            var first: OperationID?
            for i in 0..<1000 {
                let id = try add(f, "q", fairness: "big")
                if i == 0 { first = id }
            }
            let small = try add(f, "q", fairness: "small")
            #expect(f.kind.started == [first].compactMap { $0 })
            var n = 0
            while !f.kind.wasStarted(small) && n < 10 {
                if let last = f.kind.started.last { f.kind.finish(last) }
                n += 1
            }
            #expect(n <= 2, "the small tenant's one operation went after \(n) more starts, not 1000")
        }

        @Test func weightsShareStarts() throws {
            let f = Fixture()
            try f.engine.createQueue(name: "q", maxConcurrentOperationCount: 1, fairnessWeights: ["a": 3])
            var key: [OperationID: String] = [:]
            for _ in 0..<40 { key[try add(f, "q", fairness: "a")] = "a" }
            for _ in 0..<40 { key[try add(f, "q", fairness: "b")] = "b" }
            for _ in 0..<40 {
                if let last = f.kind.started.last { f.kind.finish(last) }
            }
            let counts = Dictionary(grouping: f.kind.started.prefix(40).compactMap { key[$0] }, by: { $0 }).mapValues(\.count)
            #expect(counts["a"] == 30 && counts["b"] == 10, "\(counts)")
        }

        @Test func priorityStillComesFirst() throws {
            let f = Fixture()
            try f.queue("q", max: 1, suspended: true)
            _ = try add(f, "q", fairness: "a")
            let high = try add(f, "q", fairness: "b", priority: .high)
            try f.engine.resumeQueue("q")
            #expect(f.kind.started == [high])
        }

        @Test func waitingOnNamesEveryReason() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let running = try f.add("q")
            let dep = try f.add("q", after: [running])
            #expect(try f.snapshot(dep).waitingOn == [.dependencies(count: 1)])
            #expect(try f.snapshot(running).waitingOn == [])
            let later = f.clock.now().adding(seconds: 60)
            let timed = try f.add("q", notBefore: later)
            #expect(try f.snapshot(timed).waitingOn == [.notBefore(until: later)])
            let ready = try f.add("q")
            #expect(try f.snapshot(ready).waitingOn == [.concurrency])
            try f.engine.pause(ready)
            #expect(try f.snapshot(ready).waitingOn == [.paused])
            try f.engine.resume(ready)
            try f.engine.suspend("q")
            #expect(try f.snapshot(ready).waitingOn == [.suspended, .concurrency])
            f.kind.finish(running)
            #expect(try f.snapshot(running).waitingOn == nil)
        }

        @Test func refusalsChangeNothing() throws {
            let f = Fixture(
                configuration: {
                    var c = EngineConfiguration(); c.maxLimiterKeys = 2; return c
                }())
            try f.queue("q", max: 1)
            try f.engine.createLimiter(name: "l", settings: LimiterSettings(concurrency: 1))
            #expect(throws: EngineError.invalidArgument(field: "limits[0].limiter", detail: "no limiter named 'nope'; create it with POST /v1/limiters first"))
            {
                try add(f, "q", limits: [LimitRef(limiter: "nope")])
            }
            _ = try add(f, "q", limits: [LimitRef(limiter: "l", key: "1")])
            _ = try add(f, "q", limits: [LimitRef(limiter: "l", key: "2")])
            #expect(throws: EngineError.self) { try add(f, "q", limits: [LimitRef(limiter: "l", key: "3")]) }
            #expect(throws: EngineError.self) { try add(f, "q", limits: Array(repeating: LimitRef(limiter: "l"), count: 9)) }
            #expect(throws: EngineError.self) { try add(f, "q", limits: [LimitRef(limiter: "l", key: String(repeating: "k", count: 129))]) }
            #expect(throws: EngineError.self) { try f.engine.createLimiter(name: "bad", settings: LimiterSettings()) }
            #expect(throws: EngineError.self) { try f.engine.createLimiter(name: "l", settings: LimiterSettings(concurrency: 1)) }
            #expect(throws: EngineError.self) {
                try f.engine.createLimiter(name: "r", settings: LimiterSettings(rate: RateLimit(perSecond: 0, burst: 1)))
            }
            #expect(try f.engine.queue(named: "q").operationCount == 2)
        }

        @Test func aRetryIsAStartAndWaitsForAToken() throws {
            let f = Fixture()
            try f.engine.createQueue(name: "q", maxConcurrentOperationCount: 10, rateLimit: RateLimit(perSecond: 1, burst: 1))
            let id = try f.engine.addOperationID(
                to: "q", OperationRequest(kind: "manual", options: OperationOptions(retry: RetryPolicy(maxAttempts: 3, backoff: 0.1, multiplier: 1))))
            f.kind.finish(id, .failed(type: "x", detail: "x"))
            f.clock.advance(seconds: 0.2)
            #expect(f.kind.calls(.start, for: id).count == 1, "the backoff is over but the bucket is empty")
            if case .rate? = try f.snapshot(id).waitingOn?.first {} else { Issue.record("waitingOn: \(String(describing: try f.snapshot(id).waitingOn))") }
            f.clock.advance(seconds: 1)
            #expect(f.kind.calls(.start, for: id).count == 2)
        }
    }
}

/// A shared budget for tests: what a cluster keeps in PostgreSQL, here in memory, leased by
/// several engines through `LimiterLeaseClient`, answered when the test says (`pump`).
final class FakeSharedBudget: @unchecked Sendable {
    let lock = Locked<(held: [String: [String: Int]], tokens: Int, wants: [(Int, String, String)])>(([:], 0, []))
    let concurrency: Int?
    let rate: RateLimit?
    var engines: [QueueEngine] = []
    init(concurrency: Int?, rate: RateLimit? = nil, tokens: Int = 0) {
        self.concurrency = concurrency
        self.rate = rate
        lock.withLock { $0.tokens = tokens }
    }

    struct Client: LimiterLeaseClient {
        let budget: FakeSharedBudget
        let index: Int
        func want(limiter: String, key: String) { budget.lock.withLock { $0.wants.append((index, limiter, key)) } }
    }

    func client(_ i: Int) -> Client { Client(budget: self, index: i) }

    func addTokens(_ n: Int) { lock.withLock { $0.tokens += n } }

    /// Answers every want so far, as the store's exchange would.
    func pump() {
        let wants = lock.withLock { s -> [(Int, String, String)] in
            let w = s.wants
            s.wants = []
            return w
        }
        for (i, limiter, key) in wants {
            guard let need = engines[i].leaseNeeds([(limiter, key)]).first else { continue }
            let grant = lock.withLock { s -> LimiterLeaseGrant in
                let me = "e\(i)"
                let others = s.held[key, default: [:]].filter { $0.key != me }.values.reduce(0, +)
                var slots = need.keepSlots + need.wantSlots
                if let c = concurrency { slots = max(0, min(slots, c - others)) }
                s.held[key, default: [:]][me] = slots
                let give = rate == nil ? need.wantTokens : min(s.tokens, need.wantTokens)
                if rate != nil { s.tokens -= give }
                return LimiterLeaseGrant(limiter: limiter, key: key, slots: slots, tokens: give, concurrency: concurrency, rate: rate)
            }
            // As the client does: a key still short asks again (here: at the next pump).
            let short = engines[i].leaseGranted([grant], sentAt: SystemClock().now().adding(seconds: 1e6))
            lock.withLock { s in for k in short { s.wants.append((i, k.limiter, k.key)) } }
        }
    }

    var totalHeld: Int { lock.withLock { $0.held.values.flatMap(\.values).reduce(0, +) } }
}

extension Engine.Flow {
    @Test func aSharedBudgetIsOneAcrossEngines() throws {
        let budget = FakeSharedBudget(concurrency: 3)
        let a = Fixture(), b = Fixture()
        budget.engines = [a.engine, b.engine]
        a.engine.setLeaseClient(budget.client(0), leaseSeconds: 10)
        b.engine.setLeaseClient(budget.client(1), leaseSeconds: 10)
        for f in [a, b] {
            try f.queue("q", max: 50)
            try f.engine.createLimiter(name: "stripe", settings: LimiterSettings(concurrency: 3))
        }
        var ids: [[OperationID]] = [[], []]
        for (i, f) in [a, b].enumerated() {
            for _ in 0..<5 { ids[i].append(try add(f, "q", limits: [LimitRef(limiter: "stripe", key: "acct")])) }
        }
        #expect(a.kind.started.isEmpty && b.kind.started.isEmpty, "nothing starts before a lease")
        #expect(try a.snapshot(ids[0][0]).waitingOn == [.limiter(name: "stripe", key: "acct", reason: .concurrency, until: nil)])
        budget.pump()
        #expect(a.kind.started.count + b.kind.started.count == 3, "one budget of 3 for both engines")
        #expect(budget.totalHeld == 3)
        // Finishing all of a's: its slots go back, and b's parked operations get them.
        for _ in 0..<10 {
            for (i, f) in [a, b].enumerated() {
                for id in ids[i] where f.kind.wasStarted(id) {
                    if try f.state(id) == .executing { f.kind.finish(id) }
                }
            }
            budget.pump()
            budget.pump()
            let running = try ids[0].filter { try a.state($0) == .executing }.count + ids[1].filter { try b.state($0) == .executing }.count
            #expect(running <= 3)
            #expect(budget.totalHeld <= 3)
        }
        let done = try ids[0].filter { try a.state($0) == .finished }.count + ids[1].filter { try b.state($0) == .finished }.count
        #expect(done == 10, "every operation ran, three at a time at most")
        budget.pump()
        #expect(budget.totalHeld == 0, "idle keys give their slots back")
    }

    @Test func aSharedRateIsLeasedAsTokens() throws {
        let budget = FakeSharedBudget(concurrency: nil, rate: RateLimit(perSecond: 1, burst: 2), tokens: 2)
        let a = Fixture(), b = Fixture()
        budget.engines = [a.engine, b.engine]
        a.engine.setLeaseClient(budget.client(0), leaseSeconds: 10)
        b.engine.setLeaseClient(budget.client(1), leaseSeconds: 10)
        for f in [a, b] {
            try f.queue("q", max: 50)
            try f.engine.createLimiter(name: "api", settings: LimiterSettings(rate: RateLimit(perSecond: 1, burst: 2)))
            for _ in 0..<3 { _ = try add(f, "q", limits: [LimitRef(limiter: "api", key: "k")]) }
        }
        budget.pump()
        #expect(a.kind.started.count + b.kind.started.count == 2, "the burst of 2, shared")
        budget.addTokens(1)
        budget.pump()
        budget.pump()
        #expect(a.kind.started.count + b.kind.started.count == 3)
    }
}

extension Engine.Flow {
    /// Room a key let one operation have, that it could not use, goes to the next one.
    @Test func roomUnusedByOneLetGoGoesToTheNext() throws {
        let f = Fixture()
        try f.queue("q", max: 10)
        try f.engine.createLimiter(name: "LA", settings: LimiterSettings(concurrency: 1))
        try f.engine.createLimiter(name: "LB", settings: LimiterSettings(concurrency: 1))
        let x1 = try add(f, "q", limits: [LimitRef(limiter: "LA")])
        _ = try add(f, "q", limits: [LimitRef(limiter: "LB")])
        let o1 = try add(f, "q", limits: [LimitRef(limiter: "LA"), LimitRef(limiter: "LB")])
        let o2 = try add(f, "q", limits: [LimitRef(limiter: "LA")])
        f.kind.finish(x1)
        #expect(try f.state(o1) == .ready, "o1 also needs LB, which is busy")
        #expect(try f.state(o2) == .executing, "LA's free slot went on to o2")
        // The same across queues: one let go into a suspended queue does not keep the slot.
        try f.queue("open", max: 10)
        try f.queue("held", max: 10)
        try f.engine.createLimiter(name: "LC", settings: LimiterSettings(concurrency: 1))
        let x = try add(f, "open", limits: [LimitRef(limiter: "LC")])
        let a = try add(f, "held", limits: [LimitRef(limiter: "LC")])
        let b = try add(f, "open", limits: [LimitRef(limiter: "LC")])
        try f.engine.suspend("held")
        f.kind.finish(x)
        #expect(try f.state(a) == .ready)
        #expect(try f.state(b) == .executing, "the slot went to the queue that can start it")
        #expect(try f.engine.limiter(named: "LC").running == 1)
    }

    /// A new rate takes effect at once, also when a wake-up of the old one is far away.
    @Test func aNewRateIsNotHeldBackByTheOldWakeUp() throws {
        let f = Fixture()
        try f.engine.createQueue(name: "q", maxConcurrentOperationCount: 10, rateLimit: RateLimit(perSecond: 0.001, burst: 1))
        for _ in 0..<2 { _ = try add(f, "q") }
        #expect(f.kind.started.count == 1)
        try f.engine.updateQueue("q", rateLimit: .some(RateLimit(perSecond: 2, burst: 1)))
        #expect(f.kind.started.count == 2, "the new bucket starts full")
        for _ in 0..<2 { _ = try add(f, "q") }
        f.clock.advance(seconds: 1.1)
        #expect(f.kind.started.count == 4, "two more tokens in 1.1 s at 2 per second")
        try f.engine.createLimiter(name: "LR", settings: LimiterSettings(rate: RateLimit(perSecond: 0.001, burst: 1)))
        try f.queue("k", max: 10)
        for _ in 0..<3 { _ = try add(f, "k", limits: [LimitRef(limiter: "LR")]) }
        #expect(f.kind.started.count == 5)
        try f.engine.updateLimiter("LR", rate: .some(RateLimit(perSecond: 2, burst: 1)))
        f.clock.advance(seconds: 1.1)
        #expect(f.kind.started.count == 7, "the key refills at the new rate")
    }

    /// Stale entries of cancelled operations do not pile up while a key or a queue stays blocked.
    @Test func staleEntriesStayBounded() throws {
        let f = Fixture()
        try f.queue("q", max: 10)
        try f.engine.createLimiter(name: "L", settings: LimiterSettings(concurrency: 1))
        _ = try add(f, "q", limits: [LimitRef(limiter: "L")])
        _ = try add(f, "q", limits: [LimitRef(limiter: "L")])
        for _ in 0..<5000 {
            let id = try add(f, "q", limits: [LimitRef(limiter: "L")])
            try f.engine.cancel(id)
        }
        let parked = f.engine.parkedEntries(limiter: "L", key: "")
        #expect(parked <= 2 * 1 + 64, "the parked heap holds \(parked) entries for 1 parked operation")
        try f.queue("s", max: 1, suspended: true)
        for i in 0..<5000 {
            let id = try add(f, "s", fairness: "k\(i)")
            try f.engine.cancel(id)
        }
        let keys = f.engine.fairKeys(queue: "s")
        #expect(keys <= 1100, "the fair order keeps \(keys) keys for no ready operation")
    }
}

extension Engine.Flow {
    /// While an exchange is out, starts stay within what it asked for: the store may answer
    /// with just that.
    @Test func startsWaitForAnExchangeUnderWay() throws {
        let budget = FakeSharedBudget(concurrency: 3)
        let a = Fixture()
        budget.engines = [a.engine]
        a.engine.setLeaseClient(budget.client(0), leaseSeconds: 10)
        try a.queue("q", max: 50)
        try a.engine.createLimiter(name: "l", settings: LimiterSettings(concurrency: 3))
        var ids: [OperationID] = []
        for _ in 0..<3 { ids.append(try add(a, "q", limits: [LimitRef(limiter: "l", key: "k")])) }
        budget.pump()
        #expect(a.kind.started.count == 3)
        a.kind.finish(ids[0])
        a.kind.finish(ids[1])
        // The slots going back are being exchanged (keep 1) when two more operations come.
        let needs = a.engine.leaseNeeds([("l", "k")])
        #expect(needs.first?.keepSlots == 1 && needs.first?.wantSlots == 0)
        _ = try add(a, "q", limits: [LimitRef(limiter: "l", key: "k")])
        _ = try add(a, "q", limits: [LimitRef(limiter: "l", key: "k")])
        #expect(a.kind.started.count == 3, "nothing starts beyond the exchange's keep + want while it is out")
        a.engine.leaseGranted(
            [LimiterLeaseGrant(limiter: "l", key: "k", slots: 1, tokens: 0, concurrency: 3, rate: nil)], sentAt: SystemClock().now().adding(seconds: 1e6))
        budget.pump()
        budget.pump()
        #expect(a.kind.started.count == 5, "then asked for, granted and started")
    }
}
