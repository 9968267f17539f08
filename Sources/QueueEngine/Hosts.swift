/// Hosts (API.md "Hosts: hold the work while a target is down"): a circuit breaker per target
/// host of the operations whose kind names one (`OperationKind.host(spec:)`), with the types a
/// client sees and the store keeps.

/// A breaker's state.
public enum BreakerState: String, Sendable, CaseIterable {
    /// Normal: operations to the host start.
    case closed
    /// Tripped: nothing to the host starts until `until`.
    case open
    /// One canary may start; its outcome closes (through `ramping`) or opens the host again.
    case halfOpen
    /// A slow start after a successful canary: at most 2^k starts in the k-th second.
    case ramping
}

/// What an attempt's end says about its host, as its kind judges it.
public enum HostVerdict: Sendable, Equatable {
    /// The host answered (any answer that is not a failure or a request to slow down; a 4xx too).
    case healthy
    /// A connection error, DNS or TLS failure, timeout, or a 5xx answer.
    case failure
    /// The host asked to slow down (429, or 503 with `Retry-After`): `retryAfter` seconds from
    /// now when it named a time, nil when it did not.
    case throttle(retryAfter: Double?)
}

/// A breaker set by hand (`PATCH /v1/hosts/{host}`).
public struct HostManual: Sendable, Equatable {
    /// `open` or `closed`.
    public var breaker: BreakerState
    /// When the hand setting ends by itself (back to the automatic rules); nil: until `auto`.
    public var until: Timestamp?
    public var reason: String?
    public init(breaker: BreakerState, until: Timestamp? = nil, reason: String? = nil) {
        self.breaker = breaker; self.until = until; self.reason = reason
    }
    /// Characters of a `reason`, at most.
    public static let maxReasonLength = 512
}

/// The settings of every breaker (`--breaker-failures`, `--breaker-open`, `--breaker-max-open`,
/// `--max-hosts`).
public struct BreakerSettings: Sendable, Equatable {
    /// Failures in a row that open a closed host.
    public var failures: Int = 5
    /// Seconds of the first open period (doubled at each reopening).
    public var openSeconds: Double = 5
    /// Seconds an open period lasts at most.
    public var maxOpenSeconds: Double = 300
    /// Hosts tracked at most.
    public var maxHosts: Int = 10_000
    public init(failures: Int = 5, openSeconds: Double = 5, maxOpenSeconds: Double = 300, maxHosts: Int = 10_000) {
        self.failures = failures; self.openSeconds = openSeconds; self.maxOpenSeconds = maxOpenSeconds; self.maxHosts = maxHosts
    }

    /// Seconds of a ramp at most (API.md: "until the held backlog is gone or 60 s have passed").
    public static let rampSeconds = 60
    /// Answers asking to slow down in a row for one operation before the next counts as a failed attempt.
    public static let maxThrottlesInARow = 20
    /// Longest wait a request to slow down without a usable `Retry-After` leads to, seconds.
    public static let maxThrottleSeconds = 300.0
}

/// A host as stored and as shown (`GET /v1/hosts/{host}`).
public struct HostSnapshot: Sendable, Equatable {
    /// `host:port`, lowercase.
    public var host: String
    public var state: BreakerState
    /// Operations held for it now (ready, parked on it). Not stored.
    public var held: Int = 0
    public var consecutiveFailures: Int = 0
    /// When it last opened (nil while closed since it was first seen).
    public var openedAt: Timestamp?
    /// While open: when it goes halfOpen. While ramping: when the ramp ends at the latest.
    public var until: Timestamp?
    /// The host asked to slow down: nothing to it starts before then.
    public var throttledUntil: Timestamp?
    /// The last failure: `{"type", "detail"}`.
    public var lastError: JSONValue?
    public var manual: HostManual?
    /// How many times it opened again without closing in between (the open time doubles with each).
    public var reopenings: Int = 0
    /// Moves with every stored change; with several instances, the newest one wins.
    public var revision: UInt64 = 1
    /// Times the breaker tripped (opened from closed, or opened again), since the process started. Not stored.
    public var trips: UInt64 = 0

    public init(
        host: String, state: BreakerState, held: Int = 0, consecutiveFailures: Int = 0, openedAt: Timestamp? = nil,
        until: Timestamp? = nil, throttledUntil: Timestamp? = nil, lastError: JSONValue? = nil, manual: HostManual? = nil,
        reopenings: Int = 0, revision: UInt64 = 1
    ) {
        self.host = host; self.state = state; self.held = held; self.consecutiveFailures = consecutiveFailures
        self.openedAt = openedAt; self.until = until; self.throttledUntil = throttledUntil; self.lastError = lastError
        self.manual = manual; self.reopenings = reopenings; self.revision = revision
    }

    /// Equality of what is stored (`held` and `trips` are the engine's counts, not stored).
    public static func == (a: HostSnapshot, b: HostSnapshot) -> Bool {
        a.host == b.host && a.state == b.state && a.consecutiveFailures == b.consecutiveFailures && a.openedAt == b.openedAt
            && a.until == b.until && a.throttledUntil == b.throttledUntil && a.lastError == b.lastError && a.manual == b.manual
            && a.reopenings == b.reopenings && a.revision == b.revision
    }
}
