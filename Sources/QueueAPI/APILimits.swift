import QueueEngine

/// Bounds on memory and work a client can cause; each refusal is a problem+json naming it.
public struct APILimits: Sendable {
    /// Request line plus header fields, bytes (431 past it).
    public var headerBytes = 16_384
    public var queues = 10_000
    public var unfinished = 1_000_000
    public var unfinishedPerQueue = 100_000
    /// Dependencies of one operation, a barrier's included.
    public var dependencies = 1_000
    /// Operations one `POST /v1/operations:batch` may create.
    public var batch = 1_000
    public var observersPerOperation = 16
    public var observersPerQueue = 256
    public var observers = 10_000
    public var idempotencyKeys = 100_000
    public var idempotencyBytes = 64 << 20
    /// JSON bytes of a result or error reported by a worker or a kind.
    public var resultBytes = 65_536
    /// Concurrently running `command` children; more wait for a slot.
    public var commands = 16
    /// Bytes of one list answer; `next` carries on.
    public var pageBytes = 1 << 20
    /// Bytes an SSE client may fall behind before it is cut off.
    public var sseBacklog = 1 << 20
    /// Limiters (`--max-limiters`), and keys in use per limiter (`--max-limiter-keys`).
    public var limiters = 1_000
    public var limiterKeys = 100_000
    /// Hosts' breakers: failures in a row that open one (`--breaker-failures`), its first and
    /// longest open time (`--breaker-open`, `--breaker-max-open`), and hosts tracked (`--max-hosts`).
    public var breaker = BreakerSettings()
    /// Schedules in all queues (`--max-schedules`).
    public var schedules = 10_000
    public init() {}
}
