/// Flow control (API.md "Flow control"): what a client sets, and what the engine shows.

/// A token bucket's settings: `burst` tokens at most, `perSecond` added continuously. In any
/// window of `t` seconds at most `burst + perSecond × t` starts take a token.
public struct RateLimit: Sendable, Equatable {
    public var perSecond: Double
    public var burst: Int
    public init(perSecond: Double, burst: Int) { self.perSecond = perSecond; self.burst = burst }

    /// API.md's bounds: `perSecond` from 0.001 to 100,000; `burst` at least 1.
    public static let perSecondRange: ClosedRange<Double> = 0.001...100_000
    public static let burstRange: ClosedRange<Int> = 1...1_000_000_000
    /// The default burst for a rate: `max(1, ceil(perSecond))`.
    public static func defaultBurst(_ perSecond: Double) -> Int {
        guard perSecond.isFinite, perSecond > 1 else { return 1 }
        return Int(min(perSecond.rounded(.up), Double(burstRange.upperBound)))
    }
}

/// One limiter an operation needs room in: `limiter` by name, with its budget `key`.
public struct LimitRef: Sendable, Hashable {
    public var limiter: String
    public var key: String
    public init(limiter: String, key: String = "") { self.limiter = limiter; self.key = key }
    /// At most this many per operation.
    public static let maxPerOperation = 8
    /// Keys (and fairness keys) are at most this many characters, counted as Unicode scalars
    /// (what JSON Schema's `maxLength` counts), not grapheme clusters.
    public static let maxKeyLength = 128
}

/// A limiter's budgets for one key: executing operations and/or a rate.
public struct LimiterBudget: Sendable, Equatable {
    public var concurrency: Int?
    public var rate: RateLimit?
    public init(concurrency: Int? = nil, rate: RateLimit? = nil) { self.concurrency = concurrency; self.rate = rate }
    public static let concurrencyRange: ClosedRange<Int> = 1...1_000_000_000
}

/// A limiter's settings: the budgets of every key, and the keys whose budgets differ.
public struct LimiterSettings: Sendable, Equatable {
    public var concurrency: Int?
    public var rate: RateLimit?
    public var overrides: [String: LimiterBudget]
    public init(concurrency: Int? = nil, rate: RateLimit? = nil, overrides: [String: LimiterBudget] = [:]) {
        self.concurrency = concurrency; self.rate = rate; self.overrides = overrides
    }

    /// The budgets of `key`: an override replaces the fields it names.
    public func budget(for key: String) -> LimiterBudget {
        guard let o = overrides[key] else { return LimiterBudget(concurrency: concurrency, rate: rate) }
        return LimiterBudget(concurrency: o.concurrency ?? concurrency, rate: o.rate ?? rate)
    }

    /// Overrides per limiter, at most.
    public static let maxOverrides = 1_000
}

/// A limiter as stored and as shown (`GET /v1/limiters/{name}`).
public struct LimiterSnapshot: Sendable, Equatable {
    public var name: String
    public var settings: LimiterSettings
    public var createdAt: Timestamp
    public var revision: UInt64
    /// Executing operations that name it, over all keys.
    public var running: Int
    /// Ready operations that name it and have not started, over all keys.
    public var waiting: Int
    /// Keys in use.
    public var keys: Int
    public init(name: String, settings: LimiterSettings, createdAt: Timestamp, revision: UInt64, running: Int = 0, waiting: Int = 0, keys: Int = 0) {
        self.name = name; self.settings = settings; self.createdAt = createdAt; self.revision = revision
        self.running = running; self.waiting = waiting; self.keys = keys
    }
}

/// One key of a limiter in use (`GET /v1/limiters/{name}/keys`).
public struct LimiterKeyStatus: Sendable, Equatable {
    public var key: String
    public var running: Int
    public var waiting: Int
    /// Tokens in its rate bucket now; nil when it has no rate.
    public var tokens: Double?
    /// When the next token comes, while the bucket is not full.
    public var nextTokenAt: Timestamp?
}

/// What holds an unfinished operation back (API.md "Why is it not running?").
public enum WaitReason: Sendable, Equatable {
    /// Unfinished dependencies, here or on another instance.
    case dependencies(count: Int)
    case paused
    case notBefore(until: Timestamp)
    /// Its debounce quiet time (API.md "Admission"): it starts at `until` unless another create
    /// of its key moves that.
    case debounce(until: Timestamp)
    /// Waiting for its next attempt.
    case backoff(until: Timestamp)
    /// Its queue is suspended.
    case suspended
    /// Its queue has no free slot.
    case concurrency
    /// Its queue's rate limit: the next token comes at `until`.
    case rate(until: Timestamp)
    /// A limiter it names has no room for its key.
    case limiter(name: String, key: String, reason: LimiterWaitReason, until: Timestamp?)
    /// Its host's breaker holds it (`state`: open, halfOpen, ramping, or throttled: the host
    /// asked to wait until `until`).
    case host(host: String, state: String, until: Timestamp?)

    public enum LimiterWaitReason: String, Sendable { case concurrency, rate }
}
