/// Webhook delivery counters for `/metrics`, taken from `Webhooks.metrics()`.
struct WebhookMetrics: Sendable {
    /// Registered observers (operation-wide and queue-wide).
    var observers = 0
    /// Deliveries a receiver answered with a 2xx.
    var delivered: UInt64 = 0
    /// Attempts that failed (a non-2xx answer, a timeout, no connection); each is retried.
    var failed: UInt64 = 0
    /// Events an observer could not hold (its backlog passed `--webhook-buffer` with a store that
    /// keeps no history, `--store memory`).
    var dropped: UInt64 = 0
    /// Events matched by an observer and not delivered yet, summed over observers.
    var pending: UInt64 = 0
}
