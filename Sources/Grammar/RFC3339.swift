/// The one parser for a time a client writes (`notBefore`, an archive's `exportedAt` and
/// `createdAt`, and every date field to come): RFC 3339's `date-time`, with the calendar
/// checked.
///
///     date-time = YYYY "-" MM "-" DD ("T" / "t") hh ":" mm ":" ss [ "." 1*DIGIT ] ( "Z" / "z" / ("+" / "-") hh ":" mm )
///
/// - Exactly these digits: a four-digit year, two-digit month, day, hour, minute, second.
///   `T` and `Z` may be lower case (RFC 3339 section 5.6 says so); a space for `T`, a missing
///   offset, a comma for the point, or any other ISO 8601 form is refused.
/// - The calendar is checked: month 01-12; the day must exist in that month of that year
///   (February 29 only in a leap year of the Gregorian calendar, no April 31); hour 00-23,
///   minute 00-59, second 00-59. Second 60 is refused: opqd keeps Unix time, which has no leap
///   second.
/// - The offset is 00:00 to 23:59 either way; `-00:00` is UTC.
/// - Digits past the ninth of the fraction are dropped (opqd keeps nanoseconds).
/// - The time must lie in the years 1970 to 2261 both as written and in UTC: the written year
///   is 1970 to 2261, and the instant, after the offset is applied, is from
///   1970-01-01T00:00:00Z up to (not including) 2262-01-01T00:00:00Z. So every accepted time
///   is written back (in UTC, as the API answers) in a form this parser accepts again; opqd
///   keeps 64-bit nanoseconds since 1970, which end in April 2262. Any other time is refused as
///   out of range, whatever the field.
public enum RFC3339 {
    /// The fields as written, before the offset is applied.
    public struct Fields: Equatable, Sendable {
        public var year, month, day, hour, minute, second: Int
        /// Nanoseconds of the fraction (digits past the ninth dropped).
        public var nanosecond: Int
        /// Seconds east of UTC.
        public var offsetSeconds: Int
    }

    /// Why a text is not a time of the grammar, or not an existing or representable one.
    public enum Refusal: Error, Equatable, Sendable, CustomStringConvertible {
        case syntax(String)
        case month(Int)
        case day(year: Int, month: Int, day: Int, daysInMonth: Int)
        case hour(Int)
        case minute(Int)
        case second(Int)
        case offset(String)
        case outOfRange  // the year as written
        case outOfRangeInUTC  // the instant, after the offset

        public var description: String {
            switch self {
            case let .syntax(what): return what
            case let .month(m): return "there is no month \(pad(m))"
            case let .day(y, m, d, n):
                let month = (1...12).contains(m) ? Self.monthNames[m - 1] : "month \(m)"
                return "\(month) \(y) has \(n) days, so there is no day \(pad(d))"
            case let .hour(h): return "there is no hour \(pad(h)) (00 to 23)"
            case let .minute(m): return "there is no minute \(pad(m)) (00 to 59)"
            case .second(60): return "second 60 (a leap second) is not accepted: opqd keeps Unix time"
            case let .second(s): return "there is no second \(pad(s)) (00 to 59)"
            case let .offset(what): return what
            case .outOfRange: return "it is outside the years 1970 to 2261"
            case .outOfRangeInUTC: return "its offset takes it outside the years 1970 to 2261 in UTC"
            }
        }

        static let monthNames = [
            "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December",
        ]
    }

    /// The rule in words, for problem details and openapi.yaml.
    public static let rule = "an RFC 3339 time like 2026-11-22T10:00:00Z or 2026-11-22T11:00:00.5+01:00, in the years 1970 to 2261 both as written and in UTC"

    /// The years a time may be written in, and lie in.
    public static let years = 1970...2261
    /// 2262-01-01T00:00:00Z in seconds since 1970-01-01T00:00:00Z: the first instant refused.
    public static let endSeconds: Int64 = 9_214_646_400

    public static func isLeapYear(_ y: Int) -> Bool { (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 }

    public static func daysInMonth(year: Int, month: Int) -> Int {
        switch month {
        case 2: return isLeapYear(year) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// The fields of `text`, checked against the grammar, then the calendar, then the years.
    public static func fields(_ text: some StringProtocol) -> Result<Fields, Refusal> {
        let b = Array(text.utf8)
        func digits(_ at: Int, _ count: Int, _ name: String) -> Result<Int, Refusal> {
            guard at + count <= b.count else { return .failure(.syntax("it ends before the \(name)")) }
            var v = 0
            for k in at..<(at + count) {
                let c = b[k]
                guard c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") else {
                    return .failure(.syntax("the \(name) must be \(count) digits"))
                }
                v = v * 10 + Int(c - UInt8(ascii: "0"))
            }
            return .success(v)
        }
        func expect(_ at: Int, _ options: String, _ after: String) -> Refusal? {
            guard at < b.count else { return .syntax("it ends after the \(after)") }
            guard options.utf8.contains(b[at]) else {
                let shown = options.count == 1 ? "'\(options)'" : options.map { "'\($0)'" }.joined(separator: " or ")
                return .syntax("\(shown) must follow the \(after)")
            }
            return nil
        }
        var f = Fields(year: 0, month: 0, day: 0, hour: 0, minute: 0, second: 0, nanosecond: 0, offsetSeconds: 0)
        do throws(Refusal) {
            f.year = try digits(0, 4, "year").get()
            if let r = expect(4, "-", "year") { return .failure(r) }
            f.month = try digits(5, 2, "month").get()
            if let r = expect(7, "-", "month") { return .failure(r) }
            f.day = try digits(8, 2, "day").get()
            if let r = expect(10, "Tt", "date") { return .failure(r) }
            f.hour = try digits(11, 2, "hour").get()
            if let r = expect(13, ":", "hour") { return .failure(r) }
            f.minute = try digits(14, 2, "minute").get()
            if let r = expect(16, ":", "minute") { return .failure(r) }
            f.second = try digits(17, 2, "second").get()
        } catch {
            return .failure(error)
        }
        var i = 19
        if i < b.count, b[i] == UInt8(ascii: ".") {
            i += 1
            let start = i
            var scale = 100_000_000
            while i < b.count, b[i] >= UInt8(ascii: "0"), b[i] <= UInt8(ascii: "9") {
                f.nanosecond += Int(b[i] - UInt8(ascii: "0")) * scale
                scale /= 10
                i += 1
            }
            guard i > start else { return .failure(.syntax("the fraction after '.' must have digits")) }
        }
        guard i < b.count else { return .failure(.syntax("the offset (Z or +hh:mm) is missing")) }
        switch b[i] {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            i += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            let sign = b[i] == UInt8(ascii: "+") ? 1 : -1
            guard i + 6 <= b.count, b[i + 3] == UInt8(ascii: ":"), case let .success(oh) = digits(i + 1, 2, "offset hour"),
                case let .success(om) = digits(i + 4, 2, "offset minute")
            else { return .failure(.offset("the offset must be Z or +hh:mm or -hh:mm")) }
            guard oh <= 23, om <= 59 else { return .failure(.offset("the offset must be from -23:59 to +23:59")) }
            f.offsetSeconds = sign * (oh * 3600 + om * 60)
            i += 6
        default:
            return .failure(.syntax("the offset must be Z or +hh:mm or -hh:mm"))
        }
        guard i == b.count else { return .failure(.syntax("nothing may follow the offset")) }
        guard (1...12).contains(f.month) else { return .failure(.month(f.month)) }
        let n = daysInMonth(year: f.year, month: f.month)
        guard f.day >= 1, f.day <= n else { return .failure(.day(year: f.year, month: f.month, day: f.day, daysInMonth: n)) }
        guard f.hour <= 23 else { return .failure(.hour(f.hour)) }
        guard f.minute <= 59 else { return .failure(.minute(f.minute)) }
        guard f.second <= 59 else { return .failure(.second(f.second)) }
        guard years.contains(f.year) else { return .failure(.outOfRange) }
        return .success(f)
    }

    /// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
    /// days_from_civil); exact for every four-digit year (only called with those).
    static func daysSinceEpoch(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = month > 2 ? month - 3 : month + 9
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// Nanoseconds since 1970-01-01T00:00:00Z, or why not. Cannot overflow: a four-digit year's
    /// seconds fit in Int64 with room, and only the years 1970 to 2261 reach the scaling.
    public static func nanoseconds(_ text: some StringProtocol) -> Result<Int64, Refusal> {
        switch fields(text) {
        case let .failure(r): return .failure(r)
        case let .success(f):
            let days = daysSinceEpoch(year: f.year, month: f.month, day: f.day)
            let seconds = Int64(days) * 86_400 + Int64(f.hour * 3600 + f.minute * 60 + f.second) - Int64(f.offsetSeconds)
            guard seconds >= 0, seconds < endSeconds else { return .failure(.outOfRangeInUTC) }
            return .success(seconds * 1_000_000_000 + Int64(f.nanosecond))
        }
    }
}

private func pad(_ v: Int) -> String { v < 10 ? "0\(v)" : "\(v)" }
