/// Webhook delivery counters for `/metrics`, taken from `Webhooks.metrics()`.
struct WebhookMetrics: Sendable {
    /// Registered observers (operation-wide and queue-wide).
    var observers = 0
    /// Deliveries a receiver answered with a 2xx.
    var delivered: UInt64 = 0
    /// Attempts that failed (a non-2xx answer, a timeout, no connection); each is retried.
    var failed: UInt64 = 0
    /// Events an observer can no longer be sent (its backlog passed the bound with a store that
    /// keeps no history, or the events were purged before they were delivered).
    var dropped: UInt64 = 0
    /// Events matched by an observer and not delivered yet, summed over observers.
    var pending: UInt64 = 0
}
