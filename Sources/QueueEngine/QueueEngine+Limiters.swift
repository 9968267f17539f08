extension QueueEngine {
    // MARK: - limiters (API.md "Flow control")

    /// Creates a limiter. At least one of `concurrency` and `rate`; a duplicate name is a conflict.
    @discardableResult
    public func createLimiter(name: String, settings: LimiterSettings) throws(EngineError) -> LimiterSnapshot {
        try Self.validateLimiterName(name, field: "name")
        try Self.validateLimiterSettings(settings)
        // Another instance's limiter of this name is a duplicate too.
        try ensureLimiters([name])
        return try mutate { core throws(EngineError) in
            guard core.limiters[name] == nil else {
                throw .conflict(slug: "limiter-exists", detail: "a limiter named '\(name)' already exists")
            }
            guard core.limiters.count < configuration.maxLimiters else {
                throw .limitReached("at most \(configuration.maxLimiters) limiters (--max-limiters)", limit: "too-many-limiters")
            }
            let l = LimiterRecord(name: name, settings: settings, createdAt: core.now)
            core.limiters[name] = l
            core.recordLimiter(l)
            return l.snapshot()
        }
    }

    /// Changes a limiter's settings: each non-nil argument replaces that field (`.some(nil)`
    /// removes it). It takes effect at once: buckets whose rate changed start full, and keys
    /// with more room let their parked operations go.
    @discardableResult
    public func updateLimiter(
        _ name: String, concurrency: Int?? = nil, rate: RateLimit?? = nil, overrides: [String: LimiterBudget]? = nil
    ) throws(EngineError) -> LimiterSnapshot {
        try refreshLimiter(name)
        return try mutate { core throws(EngineError) in
            guard let l = core.limiters[name] else { throw .limiterNotFound(name) }
            var s = l.settings
            if let concurrency { s.concurrency = concurrency }
            if let rate { s.rate = rate }
            if let overrides { s.overrides = overrides }
            try Self.validateLimiterSettings(s)
            guard s != l.settings else { return l.snapshot() }
            l.settings = s
            l.revision += 1
            let t = core.now.nanoseconds
            for k in l.keys.values {
                if !k.shared { k.syncBucket(now: t) }
                if k.hasParked { core.keyGotRoom(k) }
            }
            core.recordLimiter(l)
            core.settle()
            return l.snapshot()
        }
    }

    /// Deletes a limiter; refused while an unfinished operation names it.
    public func deleteLimiter(_ name: String) throws(EngineError) {
        try refreshLimiter(name)
        if let directory {
            // Operations other instances hold name it too.
            let n: Int
            do { n = try directory.operationsNaming(limiter: name) } catch { throw .unavailable("the cluster's operations cannot be read now: \(error)") }
            if n > 0 {
                throw .conflict(
                    slug: "limiter-in-use",
                    detail:
                        "limiter '\(name)' is named by \(n >= 1000 ? "1000 or more" : String(n)) unfinished operation(s); it can be deleted once they finish or are cancelled"
                )
            }
        }
        try mutate { core throws(EngineError) in
            guard let l = core.limiters[name] else { throw .limiterNotFound(name) }
            guard l.refs == 0 else {
                throw .conflict(
                    slug: "limiter-in-use",
                    detail: "limiter '\(name)' is named by \(l.refs) unfinished operation(s); it can be deleted once they finish or are cancelled")
            }
            core.limiters[name] = nil
            core.ticket &+= 1
            if core.wantsRecords { core.outRecords.append(.limiterDeleted(name)) }
        }
    }

    /// One limiter with its totals.
    public func limiter(named name: String) throws(EngineError) -> LimiterSnapshot {
        try refreshLimiter(name)
        return try read { core throws(EngineError) in
            guard let l = core.limiters[name] else { throw .limiterNotFound(name) }
            return l.snapshot()
        }
    }

    /// Every limiter, sorted by name.
    public func limiters() throws(EngineError) -> [LimiterSnapshot] {
        if let directory {
            let all: [LimiterSnapshot]
            do { all = try directory.limiters() } catch { throw .unavailable("the cluster's limiters cannot be read now: \(error)") }
            for l in all { install(l) }
            let names = Set(all.map(\.name))
            state.withLock { core in
                for (name, l) in core.limiters where !names.contains(name) && l.refs == 0 { core.limiters[name] = nil }
            }
        }
        return state.withLock { core in core.limiters.values.map { $0.snapshot() } }.sorted { $0.name < $1.name }
    }

    /// A page of a limiter's keys in use, sorted, after `after`; `next` is the last key of a
    /// full page when more follow.
    public func limiterKeys(_ name: String, after: String? = nil, limit: Int = 100) throws(EngineError) -> (keys: [LimiterKeyStatus], next: String?) {
        try ensureLimiters([name])
        return try read { core throws(EngineError) in
            guard let l = core.limiters[name] else { throw .limiterNotFound(name) }
            let t = core.now.nanoseconds
            // Sorted at most once a second per limiter: a client paging or polling the keys
            // costs a binary search and a page under the lock, not a sort of every key. A key
            // added since shows within a second; one gone is left out.
            if t.saturatingSubtract(l.sortedAt) >= 1_000_000_000 || l.sortedKeys.count < min(l.keys.count, 1) {
                l.sortedKeys = l.keys.keys.sorted()
                l.sortedAt = t
            }
            let names = l.sortedKeys
            var lo = 0
            if let after {
                var hi = names.count
                while lo < hi {
                    let mid = (lo + hi) / 2
                    if names[mid] <= after { lo = mid + 1 } else { hi = mid }
                }
            }
            let n = max(1, limit)
            var page: [String] = []
            var i = lo
            while i < names.count && page.count < n {
                if l.keys[names[i]] != nil { page.append(names[i]) }
                i += 1
            }
            let more = i < names.count
            let out = page.compactMap { key -> LimiterKeyStatus? in
                guard let k = l.keys[key] else { return nil }
                var tokens: Double? = nil
                var next: Timestamp? = nil
                if k.budget.rate != nil {
                    k.syncBucket(now: t)
                    if var b = k.bucket {
                        b.refill(t)
                        k.bucket = b
                        tokens = b.tokens
                        if !b.isFull {
                            let frac = b.tokens - b.tokens.rounded(.down)
                            let s = (1 - frac) / b.limit.perSecond
                            next = Timestamp(nanoseconds: t.saturatingAdd(Int64(saturating: s * 1e9)))
                        }
                    }
                }
                return LimiterKeyStatus(key: key, running: k.running, waiting: k.waiting, tokens: tokens, nextTokenAt: next)
            }
            return (out, more && page.count == n ? page.last : nil)
        }
    }

    /// Per limiter for `/metrics`: running, waiting, keys, and the tokens of its keys in use
    /// (summed over at most 10,000 keys in all limiters; nil without a rate); and the flow counters.
    public func flowMetrics() -> (limiters: [(name: String, running: Int, waiting: Int, keys: Int, tokens: Double?)], counters: FlowCounters) {
        state.withLock { core in
            let t = core.now.nanoseconds
            var budget = 10_000
            let all = core.limiters.values.sorted { $0.name < $1.name }.map { l -> (String, Int, Int, Int, Double?) in
                var tokens: Double? = nil
                if l.settings.rate != nil || l.settings.overrides.values.contains(where: { $0.rate != nil }) {
                    var sum = 0.0
                    // Bounded work under the lock per scrape: 10,000 keys in all limiters.
                    for k in l.keys.values.prefix(max(0, budget)) {
                        budget -= 1
                        k.syncBucket(now: t)
                        if var b = k.bucket {
                            b.refill(t)
                            k.bucket = b
                            sum += b.tokens
                        }
                    }
                    tokens = sum
                }
                return (l.name, l.running, l.waiting, l.keys.count, tokens)
            }
            return (all.map { (name: $0.0, running: $0.1, waiting: $0.2, keys: $0.3, tokens: $0.4) }, core.flowCounters)
        }
    }

    // MARK: - checks

    static func validateLimiterName(_ name: String, field: String) throws(EngineError) {
        do throws(EngineError) {
            try validateQueueName(name)
        } catch {
            throw .invalidArgument(field: field, detail: "must match [A-Za-z0-9._-]{1,64}")
        }
    }

    static func validateRate(_ r: RateLimit, field: String) throws(EngineError) {
        guard r.perSecond.isFinite, RateLimit.perSecondRange.contains(r.perSecond) else {
            throw .invalidArgument(field: "\(field).perSecond", detail: "must be a number from 0.001 to 100000; got \(r.perSecond)")
        }
        guard RateLimit.burstRange.contains(r.burst) else {
            throw .invalidArgument(field: "\(field).burst", detail: "must be an integer from 1 to 1000000000; got \(r.burst)")
        }
    }

    static func validateLimiterSettings(_ s: LimiterSettings) throws(EngineError) {
        guard s.concurrency != nil || s.rate != nil else {
            throw .invalidArgument(field: "concurrency", detail: "a limiter needs at least one of concurrency and rate")
        }
        if let c = s.concurrency, !LimiterBudget.concurrencyRange.contains(c) {
            throw .invalidArgument(field: "concurrency", detail: "must be an integer from 1 to 1000000000; got \(c)")
        }
        if let r = s.rate { try validateRate(r, field: "rate") }
        guard s.overrides.count <= LimiterSettings.maxOverrides else {
            throw .invalidArgument(field: "overrides", detail: "at most \(LimiterSettings.maxOverrides) keys; got \(s.overrides.count)")
        }
        for key in s.overrides.keys.sorted() {
            guard let o = s.overrides[key] else { continue }
            guard key.unicodeScalars.count <= LimitRef.maxKeyLength else {
                throw .invalidArgument(
                    field: "overrides", detail: "a key is at most \(LimitRef.maxKeyLength) characters; got one of \(key.unicodeScalars.count)")
            }
            guard o.concurrency != nil || o.rate != nil else {
                throw .invalidArgument(field: "overrides.\(key)", detail: "names neither concurrency nor rate")
            }
            if let c = o.concurrency, !LimiterBudget.concurrencyRange.contains(c) {
                throw .invalidArgument(field: "overrides.\(key).concurrency", detail: "must be an integer from 1 to 1000000000; got \(c)")
            }
            if let r = o.rate { try validateRate(r, field: "overrides.\(key).rate") }
        }
    }

    /// The checks of an operation's flow options that need no engine state: at most 8 limits,
    /// each named once with a key of at most 128 characters, and a fairness key of at most 128.
    static func validateFlow(_ options: OperationOptions) throws(EngineError) {
        let limits = options.limits
        guard limits.count <= LimitRef.maxPerOperation else {
            throw .invalidArgument(field: "limits", detail: "at most \(LimitRef.maxPerOperation) limits; got \(limits.count)")
        }
        var seen = Set<LimitRef>()
        for (i, ref) in limits.enumerated() {
            try validateLimiterName(ref.limiter, field: "limits[\(i)].limiter")
            guard ref.key.unicodeScalars.count <= LimitRef.maxKeyLength else {
                throw .invalidArgument(field: "limits[\(i)].key", detail: "at most \(LimitRef.maxKeyLength) characters; got \(ref.key.unicodeScalars.count)")
            }
            guard seen.insert(ref).inserted else {
                throw .invalidArgument(field: "limits[\(i)]", detail: "names limiter '\(ref.limiter)' with key '\(ref.key)' a second time")
            }
        }
        if let f = options.fairnessKey, f.unicodeScalars.count > LimitRef.maxKeyLength {
            throw .invalidArgument(field: "fairnessKey", detail: "at most \(LimitRef.maxKeyLength) characters; got \(f.unicodeScalars.count)")
        }
    }

    static func validateFairnessWeights(_ w: [String: Int]) throws(EngineError) {
        guard w.count <= LimiterSettings.maxOverrides else {
            throw .invalidArgument(field: "fairnessWeights", detail: "at most \(LimiterSettings.maxOverrides) keys; got \(w.count)")
        }
        for key in w.keys.sorted() {
            guard key.unicodeScalars.count <= LimitRef.maxKeyLength else {
                throw .invalidArgument(
                    field: "fairnessWeights", detail: "a key is at most \(LimitRef.maxKeyLength) characters; got one of \(key.unicodeScalars.count)")
            }
            if let v = w[key], !(1...1000).contains(v) {
                throw .invalidArgument(field: "fairnessWeights.\(key)", detail: "must be an integer from 1 to 1000; got \(v)")
            }
        }
    }
}

extension EngineCore {
    func recordLimiter(_ l: LimiterRecord) {
        ticket &+= 1
        if wantsRecords { outRecords.append(.limiter(l.snapshot())) }
    }
}
