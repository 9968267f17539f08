import Dispatch
import Grammar
import Locking

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A server-assigned operation id. Internally a number that only grows, so ids sort in
/// creation order; outside it is the opaque, URL-safe string `op-` + 16 hex digits.
public struct OperationID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let raw: UInt64
    public init(raw: UInt64) { self.raw = raw }

    /// Parses the string form; nil when it is not one.
    public init?(_ text: some StringProtocol) {
        let u = text.utf8
        guard u.count == 19, text.hasPrefix("op-") else { return nil }
        var v: UInt64 = 0
        for c in u.dropFirst(3) {
            let d: UInt64
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt64(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt64(c - UInt8(ascii: "a") + 10)
            default: return nil
            }
            v = v << 4 | d
        }
        raw = v
    }

    public var description: String {
        var out = [UInt8](repeating: UInt8(ascii: "0"), count: 19)
        out[0] = UInt8(ascii: "o"); out[1] = UInt8(ascii: "p"); out[2] = UInt8(ascii: "-")
        var v = raw
        let hex = Array("0123456789abcdef".utf8)
        var i = 18
        while i >= 3 { out[i] = hex[Int(v & 15)]; v >>= 4; i -= 1 }
        return String(decoding: out, as: UTF8.self)
    }

    public static func < (a: OperationID, b: OperationID) -> Bool { a.raw < b.raw }
}

/// Foundation's five `Operation.QueuePriority` levels, with Foundation's raw values.
public enum QueuePriority: Int, Sendable, CaseIterable, Comparable {
    case veryLow = -8, low = -4, normal = 0, high = 4, veryHigh = 8

    /// The API name (`veryLow` … `veryHigh`).
    public var name: String {
        switch self {
        case .veryLow: return "veryLow"
        case .low: return "low"
        case .normal: return "normal"
        case .high: return "high"
        case .veryHigh: return "veryHigh"
        }
    }

    public init?(name: String) {
        switch name {
        case "veryLow": self = .veryLow
        case "low": self = .low
        case "normal": self = .normal
        case "high": self = .high
        case "veryHigh": self = .veryHigh
        default: return nil
        }
    }

    /// 0 for veryHigh … 4 for veryLow: the order in which ready operations start.
    var rank: UInt64 { UInt64((8 - rawValue) / 4) }

    public static func < (a: QueuePriority, b: QueuePriority) -> Bool { a.rawValue < b.rawValue }
}

/// How a finished operation ended.
public enum OperationOutcome: String, Sendable, CaseIterable {
    case succeeded, failed, cancelled
}

/// What a kind reports when an operation's work ends.
public enum Completion: Sendable, Equatable {
    case succeeded(JSONValue)
    /// `type` is a short machine-readable reason (`timeout`, `http-status`, ...).
    case failed(type: String, detail: String, data: JSONValue? = nil)
}

/// Work progress as reported by a kind or an external worker.
public struct OperationProgress: Sendable, Equatable {
    public var completed: Double
    public var total: Double
    public init(completed: Double, total: Double) { self.completed = completed; self.total = total }
    public var fractionCompleted: Double { total > 0 ? min(1, max(0, completed / total)) : 0 }
}

/// Wall-clock time with nanosecond resolution, since the Unix epoch.
public struct Timestamp: Comparable, Hashable, Sendable {
    public var nanoseconds: Int64
    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }
    /// Saturates at the ends of the Int64 range; NaN is 0.
    public init(seconds: Double) { nanoseconds = Self.clampedNanoseconds(seconds) }
    public var seconds: Double { Double(nanoseconds) / 1e9 }
    public static func < (a: Timestamp, b: Timestamp) -> Bool { a.nanoseconds < b.nanoseconds }
    /// Saturates instead of overflowing (a huge or non-finite `s` from a client or a damaged
    /// record must not trap).
    public func adding(seconds s: Double) -> Timestamp {
        let ns = s * 1e9
        // A delta beyond the Int64 range takes any time to that end (NaN adds nothing).
        if ns >= 9_223_372_036_854_775_808.0 { return Timestamp(nanoseconds: .max) }
        if ns <= -9_223_372_036_854_775_808.0 { return Timestamp(nanoseconds: .min) }
        return Timestamp(nanoseconds: nanoseconds.saturatingAdd(Int64(saturating: ns)))
    }

    /// `seconds * 1e9` as Int64: NaN is 0, out of range saturates.
    public static func clampedNanoseconds(_ seconds: Double) -> Int64 { Int64(saturating: seconds * 1e9) }

    /// RFC 3339 UTC with milliseconds, e.g. `2026-11-22T10:00:00.125Z`.
    public var rfc3339: String {
        var out: [UInt8] = []
        out.reserveCapacity(24)
        writeRFC3339(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the RFC 3339 form without allocating a String.
    public func writeRFC3339(to out: inout [UInt8]) {
        // Floor divisions that cannot overflow (`nanoseconds - 999_999` would at Int64.min).
        var ms = nanoseconds / 1_000_000
        if nanoseconds % 1_000_000 < 0 { ms -= 1 }
        var days = ms / 86_400_000
        if ms % 86_400_000 < 0 { days -= 1 }
        let msOfDay = ms - days * 86_400_000
        // Civil-from-days (Howard Hinnant).
        days += 719_468
        let era = (days >= 0 ? days : days - 146_096) / 146_097
        let doe = days - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        var y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        if m <= 2 { y += 1 }
        func two(_ v: Int64) { out.append(UInt8(ascii: "0") + UInt8(v / 10)); out.append(UInt8(ascii: "0") + UInt8(v % 10)) }
        let yy = max(0, min(9999, y))
        out.append(UInt8(ascii: "0") + UInt8(yy / 1000)); out.append(UInt8(ascii: "0") + UInt8(yy / 100 % 10))
        two(yy % 100)
        out.append(UInt8(ascii: "-")); two(m); out.append(UInt8(ascii: "-")); two(d)
        out.append(UInt8(ascii: "T"))
        two(msOfDay / 3_600_000); out.append(UInt8(ascii: ":"))
        two(msOfDay / 60_000 % 60); out.append(UInt8(ascii: ":"))
        two(msOfDay / 1000 % 60); out.append(UInt8(ascii: "."))
        let milli = msOfDay % 1000
        out.append(UInt8(ascii: "0") + UInt8(milli / 100)); two(milli % 100)
        out.append(UInt8(ascii: "Z"))
    }

    /// Parses a time a client wrote: RFC 3339 with the calendar checked, from 1970 to 2261
    /// (``RFC3339``, the one grammar for it). Nil when refused; ``RFC3339/nanoseconds(_:)``
    /// says why.
    public init?(rfc3339 text: some StringProtocol) {
        guard case let .success(ns) = RFC3339.nanoseconds(text) else { return nil }
        nanoseconds = ns
    }
}

/// The engine's source of wall-clock time. Injected so tests control time.
public protocol EngineClock: Sendable {
    func now() -> Timestamp
}

/// Real time from `clock_gettime(CLOCK_REALTIME)`.
public struct SystemClock: EngineClock {
    public init() {}
    public func now() -> Timestamp {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timestamp(nanoseconds: Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec))
    }
}

extension Int64 {
    /// `Int64(v)` that never traps: NaN is 0, out of range saturates.
    public init(saturating v: Double) {
        // 2^63 is exactly representable; anything >= it does not fit.
        if v.isNaN {
            self = 0
        } else if v >= 9_223_372_036_854_775_808.0 {
            self = .max
        } else if v <= -9_223_372_036_854_775_808.0 {
            self = .min
        } else {
            self = Int64(v)
        }
    }

    /// `self + other`, pinned to the Int64 range instead of trapping.
    public func saturatingAdd(_ other: Int64) -> Int64 {
        let (r, o) = addingReportingOverflow(other)
        return o ? (other > 0 ? .max : .min) : r
    }

    /// `self - other`, pinned to the Int64 range instead of trapping.
    public func saturatingSubtract(_ other: Int64) -> Int64 {
        let (r, o) = subtractingReportingOverflow(other)
        return o ? (other < 0 ? .max : .min) : r
    }
}

/// The serial queue `DispatchScheduler` fires the engine's, the kinds' and the API's timers on
/// (timeouts, retries, long-poll deadlines, leases, webhook retries); the application's purge and
/// heartbeat timers run on `DispatchQueue.global()`.
///
/// A serial queue of its own rather than `DispatchQueue.global()`: work that blocks pool
/// threads (a slow webhook target, a test's Foundation queue) must never delay a deadline.
/// Timer callbacks only flip state and hand off, so one thread is plenty.
public enum EngineTimers {
    public static let queue = DispatchQueue(label: "opqd.timers")

    /// The longest delay a timer is armed for (about 31 years): longer ones never fire in
    /// practice, and the cap keeps the nanosecond count far from Int overflow.
    public static let maxDelaySeconds = 1e9

    /// `seconds` as a `DispatchTimeInterval`, never trapping: NaN and negatives are 0,
    /// anything over ``maxDelaySeconds`` (infinity included) is capped.
    public static func interval(seconds: Double) -> DispatchTimeInterval {
        let s = seconds.isNaN ? 0 : Swift.min(Swift.max(0, seconds), maxDelaySeconds)
        return .nanoseconds(Int(s * 1e9))
    }

    /// A deadline `seconds` from now (see ``interval(seconds:)``).
    public static func deadline(after seconds: Double) -> DispatchTime {
        .now() + interval(seconds: seconds)
    }
}
