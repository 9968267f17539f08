import QueueEngine

/// A host's row (API.md "Hosts") as both stores keep it: plain columns, `last_error` as JSON.
/// Reading refuses what the engine could never have written, naming the column, so a damaged
/// row fails the start instead of reaching the engine.
package enum HostText {
    /// The columns, in order, as both stores name them.
    package static let columns = [
        "host", "state", "consecutive_failures", "opened_at", "until", "throttled_until", "last_error", "manual_breaker", "manual_until",
        "manual_reason", "reopenings", "revision",
    ]

    /// A refusal: the column and why, e.g. `state` + `is "ajar"`.
    package struct Refusal: Error {
        package let column: String
        package let why: String
    }

    /// The values of one row, as read.
    package struct Row {
        package var host: String?
        package var state: String?
        package var consecutiveFailures: Int64
        package var openedAt: Int64?
        package var until: Int64?
        package var throttledUntil: Int64?
        package var lastError: [UInt8]?
        package var manualBreaker: String?
        package var manualUntil: Int64?
        package var manualReason: String?
        package var reopenings: Int64
        package var revision: Int64
        package init(
            host: String?, state: String?, consecutiveFailures: Int64, openedAt: Int64?, until: Int64?, throttledUntil: Int64?,
            lastError: [UInt8]?, manualBreaker: String?, manualUntil: Int64?, manualReason: String?, reopenings: Int64, revision: Int64
        ) {
            self.host = host; self.state = state; self.consecutiveFailures = consecutiveFailures; self.openedAt = openedAt
            self.until = until; self.throttledUntil = throttledUntil; self.lastError = lastError; self.manualBreaker = manualBreaker
            self.manualUntil = manualUntil; self.manualReason = manualReason; self.reopenings = reopenings; self.revision = revision
        }
    }

    /// `host:port`: not empty, at most 600 bytes, a port after the last `:`.
    package static func isHost(_ s: String) -> Bool {
        guard s.utf8.count <= 600, let colon = s.lastIndex(of: ":"), colon != s.startIndex else { return false }
        let port = s[s.index(after: colon)...]
        return !port.isEmpty && port.count <= 5 && port.allSatisfy { $0.isASCII && $0.isNumber }
    }

    package static func decode(_ r: Row) throws(Refusal) -> HostSnapshot {
        guard let host = r.host, isHost(host) else { throw Refusal(column: "host", why: "is not host:port") }
        guard let s = r.state, let state = BreakerState(rawValue: s) else {
            throw Refusal(column: "state", why: "is \(r.state.map { "\"\($0)\"" } ?? "NULL"), not one of closed, open, halfOpen, ramping")
        }
        guard r.consecutiveFailures >= 0, UInt64(r.consecutiveFailures) <= RecordLimits.maxCounter else {
            throw Refusal(column: "consecutive_failures", why: "is \(r.consecutiveFailures)")
        }
        guard (0...62).contains(r.reopenings) else { throw Refusal(column: "reopenings", why: "is \(r.reopenings), not 0 to 62") }
        guard r.revision >= 0, UInt64(r.revision) <= RecordLimits.maxCounter else { throw Refusal(column: "revision", why: "is \(r.revision)") }
        var lastError: JSONValue?
        if let bytes = r.lastError {
            guard let v = try? JSONValue.parse(bytes), case .object = v else { throw Refusal(column: "last_error", why: "is not a JSON object") }
            lastError = v
        }
        var manual: HostManual?
        switch r.manualBreaker {
        case nil:
            guard r.manualUntil == nil && r.manualReason == nil else {
                throw Refusal(column: "manual_breaker", why: "is NULL while manual_until or manual_reason is not")
            }
        case "open"?: manual = HostManual(breaker: .open)
        case "closed"?: manual = HostManual(breaker: .closed)
        case let other?: throw Refusal(column: "manual_breaker", why: "is \"\(other)\", not open or closed")
        }
        if manual != nil {
            manual?.until = r.manualUntil.map(Timestamp.init(nanoseconds:))
            if let reason = r.manualReason {
                guard reason.utf8.count <= HostManual.maxReasonLength else { throw Refusal(column: "manual_reason", why: "is longer than 512 bytes") }
                manual?.reason = reason
            }
        }
        return HostSnapshot(
            host: host, state: state, consecutiveFailures: Int(r.consecutiveFailures), openedAt: r.openedAt.map(Timestamp.init(nanoseconds:)),
            until: r.until.map(Timestamp.init(nanoseconds:)), throttledUntil: r.throttledUntil.map(Timestamp.init(nanoseconds:)),
            lastError: lastError, manual: manual, reopenings: Int(r.reopenings), revision: UInt64(r.revision))
    }
}
