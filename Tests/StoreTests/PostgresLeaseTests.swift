import Dispatch
import Foundation
import PostgresStore
import QueueEngine
import Testing

/// Limiter budgets shared by the instances of a cluster (schema 11, `PGLimiterLeases`): each
/// instance leases slots and tokens of a key from PostgreSQL, and together they never hold more
/// than the key's budget.
@Suite("PostgresLeaseTests: one limiter budget for the whole cluster")
struct PostgresLeaseTests {
    /// What schema 11 added, dropped again: the database as schema 10 left it.
    /// What schemas 15 (history), 14 (admission), 13 (schedules) and 12 (the hosts) added, then what 11 did.
    static let dropSchema11 = """
        DROP TABLE opqd.history; DROP TABLE opqd.schedules;
        ALTER TABLE opqd.operations DROP COLUMN schedule_name, DROP COLUMN schedule_nominal, DROP COLUMN admission;
        DROP TABLE opqd.hosts;
        DROP FUNCTION opqd.limiter_exchange; DROP FUNCTION opqd.limiter_budget; DROP FUNCTION opqd.read_limiter;
        DROP FUNCTION opqd.clock_ns; DROP TYPE opqd.limiter_settings; DROP TABLE opqd.limiter_slots; DROP TABLE opqd.limiter_buckets;
        """

    /// A fresh database with the schema, and `limiters` written by the store's own writer (open
    /// for the whole test: `write` changes them as an instance would).
    func withLimiters(_ limiters: [String: LimiterSettings], _ body: (String, LimiterWriter) throws -> Void) throws {
        try withTestDatabase { url in
            let writer = LimiterWriter(store: try PostgresStore(url: url))
            defer { writer.store.close() }
            try writer.write(limiters)
            try body(url, writer)
        }
    }

    final class LimiterWriter {
        let store: PostgresStore
        private var ticket: UInt64 = 0
        init(store: PostgresStore) { self.store = store }

        func write(_ limiters: [String: LimiterSettings], deleting: [String] = []) throws {
            ticket += 1
            let records = limiters.map { StoreRecord.limiter(LimiterSnapshot(name: $0.key, settings: $0.value, createdAt: t0, revision: ticket)) }
            store.append(records + deleting.map { StoreRecord.limiterDeleted($0) }, upTo: ticket)
            guard waitDurable(store, ticket), store.lastError == nil else {
                throw TestClientError("the limiters were not written: \(String(describing: store.lastError))")
            }
        }
    }

    private func leases(_ url: String, _ instance: String, lease: Double = 10, durable: Bool = true) -> PGLimiterLeases {
        PGLimiterLeases(url: url, instance: instance, leaseSeconds: lease, durableCommits: durable)
    }

    /// One key's exchange.
    private func ask(_ l: PGLimiterLeases, _ limiter: String = "l", key: String = "k", keep: Int = 0, want: Int = 0, tokens: Int = 0) throws
        -> LeaseGrant
    {
        let grants = try l.exchange([LeaseRequest(limiter: limiter, key: key, keepSlots: keep, wantSlots: want, wantTokens: tokens)])
        guard grants.count == 1, let g = grants.first else { throw TestClientError("\(grants.count) grants for one request") }
        return g
    }

    @discardableResult
    private func rows(_ url: String, _ sql: String) throws -> String { try TestPostgres.psql(url, sql) }

    @Test func twoInstancesShareOneConcurrencyBudget() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3)]) { url, _ in
            let a = leases(url, "a"), b = leases(url, "b")
            defer { a.close(); b.close() }
            #expect(try ask(a, want: 2).slots == 2)
            let first = try ask(b, want: 5)
            #expect(first.slots == 1 && first.concurrency == 3 && first.rate == nil && first.tokens == 0 && first.refusal == nil)
            #expect(try ask(a, keep: 2).slots == 2)
            #expect(try a.held(limiter: "l").map { "\($0.key)=\($0.slots)" } == ["k=3"])
            // a gives its slots back: its row goes, and b may take them.
            #expect(try ask(a).slots == 0)
            #expect(try rows(url, "SELECT string_agg(instance || '=' || slots, ',') FROM opqd.limiter_slots") == "b=1")
            #expect(try ask(b, keep: 1, want: 5).slots == 3)
            #expect(try ask(a, want: 1).slots == 0)
            // Keys are budgets of their own.
            #expect(try ask(a, key: "other", want: 3).slots == 3)
            #expect(try a.held(limiter: "l").map { "\($0.key)=\($0.slots)" } == ["k=3", "other=3"])
            // Told fewer than it keeps (b asked for 3 while a held them): a's row says what it may hold.
            #expect(try ask(b, key: "other", want: 1).slots == 0)
            #expect(try ask(a, key: "other", keep: 3).slots == 3)
        }
    }

    @Test func anOverrideGivesOneKeyABudgetOfItsOwn() throws {
        let vip = LimiterBudget(concurrency: 5, rate: RateLimit(perSecond: 2, burst: 4))
        let rateOnly = LimiterBudget(rate: RateLimit(perSecond: 1, burst: 2))
        try withLimiters(["l": LimiterSettings(concurrency: 3, overrides: ["vip": vip, "slow": rateOnly])]) { url, _ in
            let a = leases(url, "a")
            defer { a.close() }
            let grants = try a.exchange([
                LeaseRequest(limiter: "l", key: "vip", wantSlots: 9, wantTokens: 9),
                LeaseRequest(limiter: "l", key: "plain", wantSlots: 9, wantTokens: 9),
                LeaseRequest(limiter: "l", key: "slow", wantSlots: 9, wantTokens: 9),
            ])
            #expect(grants.map(\.key) == ["vip", "plain", "slow"])
            #expect(grants.map(\.slots) == [5, 3, 3])
            #expect(grants.map(\.tokens) == [4, 9, 2])
            #expect(grants.map(\.concurrency) == [5, 3, 3])
            #expect(grants.map(\.rate) == [vip.rate, nil, rateOnly.rate])
            #expect(grants[0].bucket.map { $0 < 0.5 } == true && grants[1].bucket == nil)
        }
    }

    @Test func aRateGivesTheBurstThenWhatRefilledByTheDatabaseClock() throws {
        try withLimiters(["r": LimiterSettings(rate: RateLimit(perSecond: 10, burst: 5))]) { url, _ in
            let a = leases(url, "a")
            defer { a.close() }
            let first = try ask(a, "r", tokens: 10)
            #expect(first.tokens == 5 && first.slots == LeaseGrant.unlimited && first.concurrency == nil)
            #expect(first.rate == RateLimit(perSecond: 10, burst: 5))
            let sent2 = monotonicSeconds()
            let second = try ask(a, "r", tokens: 10)
            let got2 = monotonicSeconds()
            #expect(second.tokens == 0)
            Thread.sleep(forTimeInterval: 0.3)
            let sent3 = monotonicSeconds()
            let third = try ask(a, "r", tokens: 10)
            let got3 = monotonicSeconds()
            // The database's time between the two exchanges lies between these two spans.
            let low = Int((10 * (sent3 - got2)).rounded(.down))
            let high = min(5, Int((second.bucket ?? 1) + 10 * (got3 - sent2)))
            #expect(third.tokens >= low && third.tokens <= high, "\(third.tokens) tokens, expected \(low)...\(high)")
            #expect(third.tokens >= 3)
            // Nothing asked: nothing taken.
            #expect(try ask(a, "r").tokens == 0)
            #expect(try rows(url, "SELECT count(*) FROM opqd.limiter_slots") == "0")
        }
    }

    @Test func aBucketWhoseRateChangedStartsFull() throws {
        try withLimiters(["r": LimiterSettings(rate: RateLimit(perSecond: 0.01, burst: 2))]) { url, writer in
            let a = leases(url, "a")
            defer { a.close() }
            #expect(try ask(a, "r", tokens: 5).tokens == 2)
            #expect(try ask(a, "r", tokens: 5).tokens == 0)
            try writer.write(["r": LimiterSettings(rate: RateLimit(perSecond: 0.01, burst: 4))])
            #expect(try ask(a, "r", tokens: 5).tokens == 4)
        }
    }

    /// Two instances exchange (and renew) the same keys from two threads: the slots held in the
    /// table never exceed a key's budget, the tokens taken never exceed the bucket's guarantee,
    /// and no exchange deadlocks whatever order the keys are asked in.
    @Test func concurrentExchangesNeverHoldMoreThanTheBudget() throws {
        let rate = RateLimit(perSecond: 50, burst: 5)
        try withLimiters(["l": LimiterSettings(concurrency: 3), "r": LimiterSettings(concurrency: 2, rate: rate)]) { url, _ in
            // b commits without waiting for the disk: the same guarantees while PostgreSQL runs.
            let instances = [leases(url, "a"), leases(url, "b", durable: false)]
            let observer = leases(url, "observer")
            defer { for l in instances + [observer] { l.close() } }
            let keys = ["k1", "k2", "k3", "k4"]
            let failures = Locked<[String]>([])
            let tokens = Locked(0)
            let start = monotonicSeconds()
            DispatchQueue.concurrentPerform(iterations: 2) { t in
                let me = instances[t]
                var held: [String: Int] = [:]
                var random = SystemRandomNumberGenerator()
                for i in 0..<200 {
                    let requests = (keys.map { ("l", $0) } + [("r", "k1")]).shuffled(using: &random).map { limiter, key in
                        let h = held["\(limiter)/\(key)"] ?? 0
                        return LeaseRequest(
                            limiter: limiter, key: key, keepSlots: Int.random(in: 0...h, using: &random), wantSlots: Int.random(in: 0...3, using: &random),
                            wantTokens: limiter == "r" ? Int.random(in: 0...2, using: &random) : 0)
                    }
                    do {
                        let grants = try me.exchange(requests)
                        for (q, g) in zip(requests, grants) {
                            guard g.limiter == q.limiter, g.key == q.key, g.slots <= (g.concurrency ?? 0) else {
                                failures.withLock { $0.append("\(q) -> \(g)") }
                                continue
                            }
                            held["\(g.limiter)/\(g.key)"] = g.slots
                            tokens.withLock { $0 += g.tokens }
                        }
                        if i % 20 == 0 {
                            // What the renewal finds is what the exchanges granted (no lease ran out).
                            let renewed = Set(try me.renew().map { "\($0.limiter)/\($0.key)=\($0.slots)" })
                            let granted = Set(held.filter { $0.value > 0 }.map { "\($0.key)=\($0.value)" })
                            if renewed != granted { failures.withLock { $0.append("renewed \(renewed.sorted()), granted \(granted.sorted())") } }
                        }
                        for (limiter, budget) in [("l", 3), ("r", 2)] {
                            for h in try observer.held(limiter: limiter) where h.slots > budget {
                                failures.withLock { $0.append("\(limiter)/\(h.key) held \(h.slots) slots") }
                            }
                        }
                    } catch {
                        failures.withLock { $0.append("\(error)") }
                    }
                }
            }
            let elapsed = monotonicSeconds() - start
            #expect(failures.value.isEmpty, "\(failures.value.prefix(5))")
            // At most burst + perSecond × t tokens in any window of t seconds.
            #expect(Double(tokens.value) <= Double(rate.burst) + rate.perSecond * elapsed)
            let most = try rows(url, "SELECT coalesce(max(s), 0) FROM (SELECT sum(slots) AS s FROM opqd.limiter_slots GROUP BY limiter, key) x")
            #expect((Int(most) ?? 99) <= 3)
        }
    }

    @Test func anExpiredLeaseNoLongerCountsAndARenewedOneDoes() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3)]) { url, _ in
            let a = leases(url, "a", lease: 0.2), b = leases(url, "b")
            defer { a.close(); b.close() }
            // Renewed while it runs: it keeps counting.
            #expect(try ask(a, want: 2).slots == 2)
            for _ in 0..<4 {
                Thread.sleep(forTimeInterval: 0.1)
                let renewed = try a.renew().map { "\($0.limiter)/\($0.key)=\($0.slots)" }
                #expect(renewed == ["l/k=2"])
            }
            #expect(try ask(b, want: 3).slots == 1)
            #expect(try ask(b).slots == 0)
            // Not renewed (a crashed): after the lease, b gets the whole budget and a's row goes.
            Thread.sleep(forTimeInterval: 0.3)
            #expect(try a.held(limiter: "l").isEmpty)
            #expect(try ask(b, want: 3).slots == 3)
            #expect(try rows(url, "SELECT string_agg(instance, ',') FROM opqd.limiter_slots") == "b")
            // a comes back: its renewal no longer names the key (b's exchange deleted its row).
            #expect(try a.renew().isEmpty)
            // A renewal after its own lease ran out, nobody else having asked, deletes the row.
            #expect(try ask(b).slots == 0)
            #expect(try ask(a, want: 1).slots == 1)
            Thread.sleep(forTimeInterval: 0.3)
            #expect(try a.renew().isEmpty)
            #expect(try rows(url, "SELECT count(*) FROM opqd.limiter_slots") == "0")
        }
    }

    @Test func releaseAllGivesEverySlotBack() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3), "m": LimiterSettings(concurrency: 1)]) { url, _ in
            let a = leases(url, "a"), b = leases(url, "b")
            defer { a.close(); b.close() }
            _ = try a.exchange([LeaseRequest(limiter: "l", key: "k", wantSlots: 3), LeaseRequest(limiter: "m", key: "", wantSlots: 1)])
            #expect(try ask(b, want: 1).slots == 0)
            try a.releaseAll()
            #expect(try rows(url, "SELECT count(*) FROM opqd.limiter_slots WHERE instance = 'a'") == "0")
            let grants = try b.exchange([LeaseRequest(limiter: "l", key: "k", wantSlots: 3), LeaseRequest(limiter: "m", key: "", wantSlots: 1)])
            #expect(grants.map(\.slots) == [3, 1])
            #expect(try a.renew().isEmpty)
        }
    }

    @Test func aDeletedLimiterGrantsNothingAndTakesBackWhatWasHeld() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3, rate: RateLimit(perSecond: 1, burst: 3))]) { url, writer in
            let a = leases(url, "a")
            defer { a.close() }
            #expect(try ask(a, want: 2, tokens: 1).slots == 2)
            try writer.write([:], deleting: ["l"])
            let g = try ask(a, keep: 2, want: 1, tokens: 1)
            #expect(g == LeaseGrant(limiter: "l", key: "k", slots: 0, tokens: 0, refusal: .noSuchLimiter))
            #expect(try rows(url, "SELECT count(*) FROM opqd.limiter_slots") == "0")
            #expect(try ask(a, "never-made").refusal == .noSuchLimiter)
            // What it left behind goes with the next prune.
            #expect(try a.prune().buckets == 1)
            #expect(try rows(url, "SELECT count(*) FROM opqd.limiter_buckets") == "0")
        }
    }

    /// A limiter's row that opqd could not have written grants nothing for that limiter (rather
    /// than a guessed budget), says why, and leaves the other limiters of the same exchange alone.
    @Test(arguments: [
        ("overrides = '[1]'", "column overrides is not a JSON object"), ("overrides = 'nope'", "column overrides is not JSON"),
        (#"overrides = '{"k":5}'"#, #"column overrides has no budget for "k""#),
        (#"overrides = '{"k":{}}'"#, #"column overrides names neither concurrency nor rate for "k""#),
        (#"overrides = '{"k":{"concurrency":1.5}}'"#, #"column overrides has concurrency 1.5 for "k""#),
        (#"overrides = '{"k":{"concurrency":"2"}}'"#, #"column overrides has concurrency "2" for "k""#),
        (#"overrides = '{"k":{"rate":{"perSecond":1}}}'"#, #"column overrides has a rate without perSecond and burst for "k""#),
        (#"overrides = '{"k":{"rate":{"perSecond":1e999,"burst":1}}}'"#, #"column overrides has rate"#),
        ("concurrency = 0", "column concurrency is 0"), ("concurrency = NULL", "columns concurrency and rate_per_second are both NULL"),
        ("rate_per_second = 'NaN', rate_burst = 1", "column rate_per_second is NaN"), ("rate_burst = 2", "not both set"),
        ("rate_per_second = 1, rate_burst = 0", "column rate_burst is 0"),
    ])
    func aDamagedLimiterRowGrantsNothingAndSaysWhy(set: String, reason: String) throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3), "ok": LimiterSettings(concurrency: 1)]) { url, _ in
            let a = leases(url, "a")
            defer { a.close() }
            #expect(try ask(a, want: 2).slots == 2)
            try rows(url, "UPDATE opqd.limiters SET \(set) WHERE name = 'l'")
            let grants = try a.exchange([
                LeaseRequest(limiter: "l", key: "k", keepSlots: 2, wantSlots: 1, wantTokens: 1), LeaseRequest(limiter: "ok", key: "k", wantSlots: 1),
            ])
            #expect(grants.map(\.slots) == [0, 1] && grants.map(\.tokens) == [0, 0])
            guard case let .damaged(why)? = grants.first?.refusal else {
                Issue.record("not refused as damaged: \(grants)")
                return
            }
            #expect(why.hasPrefix("limiters row \"l\": ") && why.contains(reason), "\(why)")
            #expect(try rows(url, "SELECT string_agg(limiter, ',') FROM opqd.limiter_slots") == "ok")
        }
    }

    /// A bucket row edited by hand (tokens NaN, a refill time far off) gives nothing until it
    /// refills, and heals: never a crash, never more than the burst.
    @Test func aDamagedBucketGivesNothingUntilItRefills() throws {
        try withLimiters(["r": LimiterSettings(rate: RateLimit(perSecond: 1000, burst: 3))]) { url, _ in
            let a = leases(url, "a")
            defer { a.close() }
            #expect(try ask(a, "r", tokens: 1).tokens == 1)
            try rows(url, "UPDATE opqd.limiter_buckets SET tokens = 'NaN', refilled_at = 9000000000000000000")
            #expect(try ask(a, "r", tokens: 5).tokens == 0)
            Thread.sleep(forTimeInterval: 0.01)
            let g = try ask(a, "r", tokens: 5)
            #expect(g.tokens >= 1 && g.tokens <= 3)
            try rows(url, "UPDATE opqd.limiter_buckets SET tokens = 'Infinity', refilled_at = -9000000000000000000")
            #expect(try ask(a, "r", tokens: 5).tokens == 3)
        }
    }

    /// PostgreSQL's JSON cannot hold U+0000, which a key can: an override of such a key still
    /// applies (and only to it).
    @Test func anOverrideOfAKeyHoldingUPlus0000Applies() throws {
        let settings = LimiterSettings(concurrency: 1, overrides: ["a\u{0}b": LimiterBudget(concurrency: 4), #"x\u0000"#: LimiterBudget(concurrency: 2)])
        try withLimiters(["l": settings]) { url, _ in
            let a = leases(url, "a")
            defer { a.close() }
            let grants = try a.exchange(
                ["a\u{0}b", "a\u{0}c", "ab", #"x\u0000"#, "x\u{0}"].map { LeaseRequest(limiter: "l", key: $0, wantSlots: 9) })
            #expect(grants.map(\.slots) == [4, 1, 1, 2, 1])
            #expect(try a.held(limiter: "l").map(\.key) == ["a\u{0}b", "a\u{0}c", "ab", "x\u{0}", #"x\u0000"#])
        }
    }

    @Test func aKeyAskedForTwiceInOneExchangeIsRefused() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3)]) { url, _ in
            let a = leases(url, "a")
            defer { a.close() }
            let twice = Result { () throws(PGLeaseError) in
                try a.exchange([LeaseRequest(limiter: "l", key: "k", wantSlots: 1), LeaseRequest(limiter: "l", key: "k", wantSlots: 2)])
            }
            guard case let .failure(error) = twice else { throw TestClientError("a key asked for twice was accepted") }
            #expect(error.reason == .invalidRequest && error.description.contains(#"key "k" asked for twice"#), "\(error)")
            #expect(try rows(url, "SELECT count(*) FROM opqd.limiter_slots") == "0")
            #expect(try a.exchange([]).isEmpty)
        }
    }

    @Test func pruneForgetsExpiredSlotsAndFullBucketsOnly() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 3, rate: RateLimit(perSecond: 0.001, burst: 2))]) { url, _ in
            let a = leases(url, "a", lease: 0.2), b = leases(url, "b")
            defer { a.close(); b.close() }
            _ = try a.exchange([LeaseRequest(limiter: "l", key: "crashed", wantSlots: 1)])
            _ = try b.exchange([LeaseRequest(limiter: "l", key: "live", wantSlots: 1), LeaseRequest(limiter: "l", key: "spent", wantTokens: 1)])
            Thread.sleep(forTimeInterval: 0.3)
            #expect(try b.prune() == (slots: 1, buckets: 0))
            // The crashed instance's key is idle and full now; the spent bucket is not full, the live key holds slots.
            #expect(try b.prune() == (slots: 0, buckets: 1))
            #expect(try rows(url, "SELECT string_agg(convert_from(key, 'UTF8'), ',' ORDER BY key) FROM opqd.limiter_buckets") == "live,spent")
        }
    }

    @Test func aDatabaseOfSchema10IsMigratedTo11() throws {
        try withLimiters(["l": LimiterSettings(concurrency: 2)]) { url, writer in
            writer.store.close()
            try rows(url, Self.dropSchema11 + " UPDATE opqd.schema_version SET version = 10")
            // The server ends the closed store's session (and its instance lock) on its own time.
            var store: PostgresStore?
            for _ in 0..<100 where store == nil {
                store = try? PostgresStore(url: url)
                if store == nil { Thread.sleep(forTimeInterval: 0.05) }
            }
            guard let store else { throw TestClientError("the store did not open again") }
            defer { store.close() }
            #expect(try store.load().limiters.map(\.name) == ["l"])
            #expect(try rows(url, "SELECT version FROM opqd.schema_version") == "15")
            let a = leases(url, "a")
            defer { a.close() }
            #expect(try ask(a, want: 3).slots == 2)
        }
    }

    @Test func anUnreachableDatabaseIsAnErrorNotACrash() throws {
        let a = PGLimiterLeases(url: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", instance: "a", leaseSeconds: 1)
        defer { a.close() }
        let exchanged = Result { () throws(PGLeaseError) in try a.exchange([LeaseRequest(limiter: "l", key: "k", wantSlots: 1)]) }
        guard case let .failure(error) = exchanged else { throw TestClientError("an exchange without a database succeeded") }
        #expect(error.reason == .unavailable && error.description.hasPrefix("exchanging limiter leases failed: "), "\(error)")
        #expect(throws: PGLeaseError.self) { try a.renew() }
    }
}
