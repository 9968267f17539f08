/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds, or an HTTP-date in any of the three forms a
/// recipient must accept (IMF-fixdate, obsolete RFC 850, asctime). A small strict parser over
/// bytes: no locale, no Foundation formatter, no trapping arithmetic on what a target sent, and
/// total for any `now` too (NaN and infinities included: a public function, a fuzzer may call it).
public enum RetryAfter {
    /// The longest wait reported, in seconds (about 292 years): a longer delta saturates here,
    /// and a date further ahead is cut to it, so that a caller may count it in `Int64`
    /// nanoseconds without trapping.
    public static let maxSeconds = 9_223_372_036.0

    /// Seconds from `now` (Unix seconds) that `value` asks to wait: 0 for a date in the past, at
    /// most ``maxSeconds``; nil when it is not a valid value (a date needs a finite `now`).
    public static func seconds(_ value: String, now: Double) -> Double? {
        var s = Array(value.utf8)[...]
        while let f = s.first, f == 0x20 || f == 0x09 { s = s.dropFirst() }
        while let l = s.last, l == 0x20 || l == 0x09 { s = s.dropLast() }
        guard !s.isEmpty else { return nil }
        if s.allSatisfy(isDigit) {
            // delta-seconds = 1*DIGIT, of any length: saturates instead of growing to infinity.
            var n = 0.0
            for b in s {
                n = n * 10 + Double(b &- 0x30)
                if n >= maxSeconds { return maxSeconds }
            }
            return n
        }
        guard s.count <= 32, now.isFinite, let at = date(Array(s), now: now) else { return nil }
        return min(max(0, at - now), maxSeconds)
    }

    /// The `Retry-After` of a response's `headers` (name case-insensitive, ASCII only), read as
    /// ``seconds(_:now:)``. The field is a singleton: a repeated one counts only when every
    /// repetition says the same; fields that disagree, or one that cannot be read, give nil.
    public static func seconds(in headers: [(String, String)], now: Double) -> Double? {
        var result: Double?
        for (name, value) in headers where isRetryAfter(name) {
            guard let v = seconds(value, now: now), result == nil || result == v else { return nil }
            result = v
        }
        return result
    }

    private static func isRetryAfter(_ name: String) -> Bool {
        let expected = "retry-after".utf8
        guard name.utf8.count == expected.count else { return false }
        return zip(name.utf8, expected).allSatisfy { b, e in (b >= 0x41 && b <= 0x5A ? b | 0x20 : b) == e }
    }

    // MARK: - dates

    static let days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    static let longDays = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// Unix seconds of an HTTP-date; nil unless it is one, with a day that exists. `now` (finite)
    /// places an RFC 850 two-digit year.
    static func date(_ b: [UInt8], now: Double) -> Double? {
        guard let comma = b.firstIndex(of: 0x2C) else { return asctime(b) }
        let dayName = String(decoding: b[..<comma], as: UTF8.self)
        let rest = Array(b[(comma + 1)...])
        if days.contains(dayName) { return imf(rest) }
        if longDays.contains(dayName) { return rfc850(rest, now: now) }
        return nil
    }

    /// ` 06 Nov 1994 08:49:37 GMT`
    private static func imf(_ b: [UInt8]) -> Double? {
        guard b.count == 25, b[0] == 0x20, b[3] == 0x20, b[7] == 0x20, b[12] == 0x20, b[21] == 0x20,
            String(decoding: b[22...], as: UTF8.self) == "GMT",
            let day = number(b[1..<3]), let month = month(b[4..<7]), let year = number(b[8..<12]), let time = clock(b[13..<21])
        else { return nil }
        return unix(year: year, month: month, day: day, time)
    }

    /// ` 06-Nov-94 08:49:37 GMT`. RFC 9110 §5.6.7: a two-digit year that would be more than 50
    /// years ahead of `now` is the latest past year with those digits; so the year is the one
    /// with those digits from 49 years before `now`'s year to 50 after it.
    private static func rfc850(_ b: [UInt8], now: Double) -> Double? {
        guard b.count == 23, b[0] == 0x20, b[3] == 0x2D, b[7] == 0x2D, b[10] == 0x20, b[19] == 0x20,
            String(decoding: b[20...], as: UTF8.self) == "GMT",
            let day = number(b[1..<3]), let month = month(b[4..<7]), let yy = number(b[8..<10]), let time = clock(b[11..<19])
        else { return nil }
        let thisYear = year(of: now)
        var year = (thisYear / 100) * 100 + yy
        if year > thisYear + 50 { year -= 100 }
        if year < thisYear - 49 { year += 100 }
        return unix(year: year, month: month, day: day, time)
    }

    /// `Sun Nov  6 08:49:37 1994` (the day as two digits or a space and one digit).
    private static func asctime(_ b: [UInt8]) -> Double? {
        guard b.count == 24, b[3] == 0x20, b[7] == 0x20, b[10] == 0x20, b[19] == 0x20,
            days.contains(String(decoding: b[0..<3], as: UTF8.self)),
            let month = month(b[4..<7]), let time = clock(b[11..<19]), let year = number(b[20..<24])
        else { return nil }
        let dd = b[8] == 0x20 ? b[9...9] : b[8..<10]
        guard let day = number(dd) else { return nil }
        return unix(year: year, month: month, day: day, time)
    }

    private static func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }

    /// 1 to 4 digits.
    private static func number(_ b: ArraySlice<UInt8>) -> Int? {
        guard !b.isEmpty, b.count <= 4, b.allSatisfy(isDigit) else { return nil }
        return b.reduce(0) { $0 * 10 + Int($1 &- 0x30) }
    }

    private static func month(_ b: ArraySlice<UInt8>) -> Int? {
        months.firstIndex(of: String(decoding: b, as: UTF8.self)).map { $0 + 1 }
    }

    /// `HH:MM:SS` as seconds of the day (a leap second's 60 allowed).
    private static func clock(_ b: ArraySlice<UInt8>) -> Int? {
        let a = Array(b)
        guard a.count == 8, a[2] == 0x3A, a[5] == 0x3A, let h = number(a[0..<2]), let m = number(a[3..<5]), let s = number(a[6..<8]),
            h <= 23, m <= 59, s <= 60
        else { return nil }
        return h * 3600 + m * 60 + s
    }

    /// Unix seconds of a civil date in UTC (days from civil, proleptic Gregorian); nil for a
    /// year outside 1-9999 or a day the month does not have (30 February, 29 February 1900).
    private static func unix(year: Int, month: Int, day: Int, _ seconds: Int) -> Double? {
        guard (1...9999).contains(year), (1...12).contains(month), day >= 1 else { return nil }
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
        let lengths = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard day <= lengths[month - 1] else { return nil }
        let y = month <= 2 ? year - 1 : year
        let era = y / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let daysSinceEpoch = era * 146_097 + doe - 719_468
        return Double(daysSinceEpoch) * 86_400 + Double(seconds)
    }

    /// The UTC year of Unix seconds `t`, clamped to 1970-9999 (NaN: 1970); civil from days.
    static func year(of t: Double) -> Int {
        let clamped = t.isNaN ? 0 : min(max(t, 0), 253_402_300_799)
        let days = Int((clamped / 86_400).rounded(.down))
        let z = days + 719_468
        let era = z / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        return yoe + era * 400 + (mp >= 10 ? 1 : 0)
    }
}
