import Locking

/// What this engine asks of a limiter's shared budget for one key (several instances: the
/// budget is one for the whole cluster, kept elsewhere, and leased in small batches).
public struct LimiterLeaseNeed: Sendable, Equatable {
    public var limiter: String
    public var key: String
    /// Slots this instance keeps: those its running operations use.
    public var keepSlots: Int
    /// More slots it could use now (its parked operations).
    public var wantSlots: Int
    /// Tokens it could use now.
    public var wantTokens: Int
}

/// What the shared budget gave for one key.
public struct LimiterLeaseGrant: Sendable, Equatable {
    public var limiter: String
    public var key: String
    /// Slots this instance now holds (may be fewer than it keeps: then it starts nothing more
    /// until its running operations drop below).
    public var slots: Int
    /// Tokens given (added to those it holds).
    public var tokens: Int
    /// The key's budget as the shared store has it (the limiter's settings may have changed on
    /// another instance).
    public var concurrency: Int?
    public var rate: RateLimit?
    public init(limiter: String, key: String, slots: Int, tokens: Int, concurrency: Int?, rate: RateLimit?) {
        self.limiter = limiter; self.key = key; self.slots = slots; self.tokens = tokens
        self.concurrency = concurrency; self.rate = rate
    }
}

/// Where an engine with shared limiter budgets sends its wants (`QueueEngine.setLeaseClient`).
public protocol LimiterLeaseClient: Sendable {
    /// The key has parked operations and no room, or holds slots it no longer uses: ask the
    /// shared budget (`QueueEngine.leaseNeeds`, then `leaseGranted`), soon and batched.
    func want(limiter: String, key: String)
}

/// A key's lease of a shared budget.
struct KeyLease {
    /// Slots held from the shared budget.
    var slots = 0
    /// While an exchange is out: the most it can leave this instance holding (what it kept and
    /// wanted). Starts stay within it until the answer comes, whatever `slots` said before.
    var inFlightCap: Int?
    /// Until when the slots are this instance's: the send time of the exchange or renewal that
    /// last confirmed them, plus the lease (engine clock, ns). Past it they count as none.
    var validUntil: Int64 = .min
    /// Tokens held, each one start, until `tokensUntil` (ns): tokens are taken for starts due
    /// now, and not kept to be spent later beside another instance's.
    var tokens = 0
    var tokensUntil: Int64 = .min
    /// A want is out (`LimiterLeaseClient.want`) and not answered yet.
    var asking = false
    /// The budget as last granted (nil before the first grant: the local settings say which
    /// budgets apply).
    var concurrency: Int?
    var rate: RateLimit?
    var granted = false
}

extension QueueEngine {
    /// Makes every limiter's budget a shared one, leased through `client` (a cluster), with
    /// holdings that lapse `leaseSeconds` after they were last confirmed.
    public func setLeaseClient(_ client: any LimiterLeaseClient, leaseSeconds: Double) {
        leaseClient.withLock { $0 = client }
        state.withLock {
            $0.sharedLimiters = true
            $0.leaseNanos = Timestamp.clampedNanoseconds(max(0.1, leaseSeconds))
        }
    }

    /// The current needs of these keys (a key this engine no longer has keeps and wants nothing:
    /// its slots go back).
    public func leaseNeeds(_ keys: [(limiter: String, key: String)]) -> [LimiterLeaseNeed] {
        state.withLock { core in
            keys.map { lk in
                guard let k = core.limiters[lk.limiter]?.keys[lk.key] else {
                    return LimiterLeaseNeed(limiter: lk.limiter, key: lk.key, keepSlots: 0, wantSlots: 0, wantTokens: 0)
                }
                let parked = k.parkedCount
                let (usesSlots, usesTokens) = k.leaseDimensions
                let batch = min(parked, 64)
                // The store sets the holding to keep + want (at most): the running ones, and one
                // per parked operation. Until it answers, starts stay within that.
                let want = usesSlots ? batch : 0
                k.lease.inFlightCap = k.running + want
                // Tokens only for starts that can happen now: not more than the slots allow.
                let startable = usesSlots ? min(batch, max(0, k.lease.slots + want - k.running)) : batch
                return LimiterLeaseNeed(
                    limiter: lk.limiter, key: lk.key, keepSlots: k.running, wantSlots: want,
                    wantTokens: usesTokens ? max(0, startable - k.currentTokens(core.now.nanoseconds)) : 0)
            }
        }
    }

    /// Takes the shared budget's answers: keys with room let their parked operations go.
    /// Returns the keys that still have parked operations and no room (ask again later).
    /// `sentAt`: when the exchange was sent (engine clock): the slots are confirmed from then.
    @discardableResult
    public func leaseGranted(_ grants: [LimiterLeaseGrant], sentAt: Timestamp) -> [(limiter: String, key: String)] {
        var unsatisfied: [(limiter: String, key: String)] = []
        try? mutate { core throws(EngineError) in
            // Keys with room let operations go here; those still short are asked for again by
            // the client, a moment later (not at once, from in here).
            core.inLeaseGrant = true
            defer { core.inLeaseGrant = false }
            let t = core.now.nanoseconds
            for g in grants {
                guard let k = core.limiters[g.limiter]?.keys[g.key] else { continue }
                k.lease.asking = false
                k.lease.inFlightCap = nil
                k.lease.slots = max(0, g.slots)
                k.lease.validUntil = sentAt.nanoseconds.saturatingAdd(core.leaseNanos)
                k.lease.tokens = min(1_000_000, k.currentTokens(t) + max(0, g.tokens))
                // Spent at once or given up: at most a tenth of a second, or one token's time.
                let life = g.rate.map { max(0.1, 1 / $0.perSecond) } ?? 0.1
                k.lease.tokensUntil = t.saturatingAdd(Timestamp.clampedNanoseconds(life))
                k.lease.concurrency = g.concurrency
                k.lease.rate = g.rate
                k.lease.granted = true
                if k.hasParked { core.keyGotRoom(k) }
                if k.hasParked && k.room(now: core.now.nanoseconds) == 0 { unsatisfied.append((g.limiter, g.key)) }
                // Its slots went back and nothing names it: forgotten, as an idle key is.
                if k.refs == 0 && k.isIdle(now: core.now.nanoseconds) { k.limiter.keys[k.key] = nil }
            }
        }
        return unsatisfied
    }

    /// A renewal sent at `sentAt` confirmed `held` (what the store still has for this instance):
    /// those keys' slots are this instance's for another lease; a key it no longer has holds
    /// none (and asks again); a row the engine does not know is given back. Returns the keys to
    /// exchange.
    public func leaseRenewed(_ held: [(limiter: String, key: String, slots: Int)], sentAt: Timestamp) -> [(limiter: String, key: String)] {
        var again: [(limiter: String, key: String)] = []
        try? mutate { core throws(EngineError) in
            var confirmed = Set<String>()
            for h in held {
                confirmed.insert(h.limiter + "\u{0}" + h.key)
                guard let k = core.limiters[h.limiter]?.keys[h.key], k.lease.slots > 0 else {
                    again.append((h.limiter, h.key))
                    continue
                }
                k.lease.validUntil = sentAt.nanoseconds.saturatingAdd(core.leaseNanos)
                if h.slots < k.lease.slots { k.lease.slots = h.slots }
            }
            for l in core.limiters.values {
                for k in l.keys.values where k.lease.slots > 0 && !confirmed.contains(l.name + "\u{0}" + k.key) && k.lease.inFlightCap == nil {
                    k.lease.slots = 0
                    again.append((l.name, k.key))
                }
            }
        }
        return again
    }

    /// Every key that holds slots from the shared budget, with what it holds (renewal, display).
    public func heldLeases() -> [(limiter: String, key: String, slots: Int)] {
        state.withLock { core in
            core.limiters.values.flatMap { l in
                l.keys.values.filter { $0.lease.slots > 0 }.map { (l.name, $0.key, $0.lease.slots) }
            }
        }
    }
}

extension LimiterKey {
    /// The slots this instance may fill now: held and confirmed, within an exchange under way.
    func usableSlots(_ now: Int64) -> Int {
        guard now <= lease.validUntil else { return 0 }
        return min(lease.slots, lease.inFlightCap ?? Int.max)
    }

    /// Tokens held and not lapsed.
    func currentTokens(_ now: Int64) -> Int { now <= lease.tokensUntil ? lease.tokens : 0 }

    /// Which budgets apply to this key: slots, tokens.
    var leaseDimensions: (slots: Bool, tokens: Bool) {
        if lease.granted { return (lease.concurrency != nil, lease.rate != nil) }
        let b = budget
        return (b.concurrency != nil, b.rate != nil)
    }
}

extension EngineCore {
    /// Asks the shared budget for `k` once (until it answers).
    func askLease(_ k: LimiterKey) {
        guard sharedLimiters, !k.lease.asking, !inLeaseGrant else { return }
        k.lease.asking = true
        let (limiter, key) = (k.limiter.name, k.key)
        guard let client = engine.leaseClient.withLock({ $0 }) else { return }
        effects.append(.call({ client.want(limiter: limiter, key: key) }))
    }
}

/// Where an instance of a cluster reads the limiters every instance shares (their committed rows).
public protocol LimiterDirectory: Sendable {
    func limiter(named name: String) throws -> LimiterSnapshot?
    func limiters() throws -> [LimiterSnapshot]
    /// Committed unfinished operations that name the limiter, on any instance.
    func operationsNaming(limiter name: String) throws -> Int
}

extension QueueEngine {
    /// Limiters are shared with other instances: their committed rows are read from `directory`.
    public func setLimiterDirectory(_ directory: any LimiterDirectory) {
        limiterDirectory.withLock { $0 = directory }
    }

    var directory: (any LimiterDirectory)? { limiterDirectory.withLock { $0 } }

    /// Loads the limiters of `names` this engine does not know yet from the directory (another
    /// instance made them). Outside the lock; a name the directory does not have either is left
    /// for the engine's own check to refuse.
    func ensureLimiters(_ names: some Sequence<String>) throws(EngineError) {
        guard let directory else { return }
        let unknown = state.withLock { core in Set(names.filter { core.limiters[$0] == nil }) }
        for name in unknown.sorted() {
            let found: LimiterSnapshot?
            do { found = try directory.limiter(named: name) } catch { throw .unavailable("the cluster's limiters cannot be read now: \(error)") }
            if let found { install(found) }
        }
    }

    /// The directory's copy of limiter `name` replaces this engine's (settings changed on another
    /// instance); one the directory no longer has is forgotten here unless something names it.
    func refreshLimiter(_ name: String) throws(EngineError) {
        guard let directory else { return }
        let found: LimiterSnapshot?
        do { found = try directory.limiter(named: name) } catch { throw .unavailable("the cluster's limiters cannot be read now: \(error)") }
        if let found {
            install(found)
        } else {
            state.withLock { core in
                if let l = core.limiters[name], l.refs == 0 { core.limiters[name] = nil }
            }
        }
    }

    /// Puts a committed limiter into this engine (no record: it is durable already).
    func install(_ s: LimiterSnapshot) {
        try? mutate { core throws(EngineError) in
            if let l = core.limiters[s.name] {
                guard l.settings != s.settings || l.revision != s.revision else { return }
                l.settings = s.settings
                l.revision = max(l.revision, s.revision)
                for k in l.keys.values where k.hasParked { core.keyGotRoom(k) }
            } else {
                let l = LimiterRecord(name: s.name, settings: s.settings, createdAt: s.createdAt)
                l.revision = s.revision
                core.limiters[s.name] = l
            }
        }
    }
}
