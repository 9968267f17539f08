/// `retry` of API.md: attempts and exponential backoff between them.
public struct RetryPolicy: Sendable, Equatable {
    public var maxAttempts: Int
    public var backoff: Double
    public var multiplier: Double
    public init(maxAttempts: Int = 1, backoff: Double = 1, multiplier: Double = 2) {
        self.maxAttempts = maxAttempts; self.backoff = backoff; self.multiplier = multiplier
    }
    /// Seconds to wait before attempt `next` (2, 3, ...).
    public func delay(beforeAttempt next: Int) -> Double {
        backoff * pow(multiplier, Double(max(0, next - 2)))
    }
}

@inline(__always) func pow(_ base: Double, _ exp: Double) -> Double {
    var r = 1.0
    var i = 0
    while Double(i) < exp { r *= base; i += 1 }
    return r
}

/// The optional, kind-independent settings of an operation.
public struct OperationOptions: Sendable, Equatable {
    /// Seconds an attempt may execute before it fails with `timeout`.
    public var timeout: Double?
    public var retry: RetryPolicy?
    /// Not started before this time.
    public var notBefore: Timestamp?
    /// The limiters it needs room in to start (API.md "Flow control"), as given.
    public var limits: [LimitRef]
    /// Its tenant for the queue's round-robin among ready operations of one priority; nil is `""`.
    public var fairnessKey: String?
    public init(timeout: Double? = nil, retry: RetryPolicy? = nil, notBefore: Timestamp? = nil, limits: [LimitRef] = [], fairnessKey: String? = nil) {
        self.timeout = timeout; self.retry = retry; self.notBefore = notBefore
        self.limits = limits; self.fairnessKey = fairnessKey
    }
}

/// What a client asks for when it adds an operation.
public struct OperationRequest: Sendable {
    public var kind: String
    public var name: String?
    public var queuePriority: QueuePriority
    public var dependencies: [OperationID]
    public var spec: JSONValue?
    public var options: OperationOptions
    /// What the create asks about the operations already in its queue (API.md "Admission").
    public var admission: Admission?
    public init(
        kind: String, name: String? = nil, queuePriority: QueuePriority = .normal, dependencies: [OperationID] = [],
        spec: JSONValue? = nil, options: OperationOptions = OperationOptions()
    ) {
        self.kind = kind; self.name = name; self.queuePriority = queuePriority
        self.dependencies = dependencies; self.spec = spec; self.options = options
    }
}
