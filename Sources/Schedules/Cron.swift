/// A cron expression (API.md "Schedules"): 5 fields (minute hour day-of-month month
/// day-of-week) or 6 (seconds first); `*`, lists, ranges, steps, month and day names (any
/// case), and `@yearly @annually @monthly @weekly @daily @midnight @hourly`. Day-of-month and
/// day-of-week as Vixie cron: when both are restricted, a day matches when either does.
public struct Cron: Sendable, Equatable {
    /// Allowed values, as bit sets.
    var seconds: UInt64
    var minutes: UInt64
    var hours: UInt64
    var daysOfMonth: UInt64
    var months: UInt64
    var daysOfWeek: UInt64
    var domRestricted: Bool
    var dowRestricted: Bool
    /// The hour field is `*` or a step (`*/2`): such times follow elapsed time across a change
    /// of the clocks (API.md's daylight-saving rule).
    public let hourFollowsElapsedTime: Bool
    public let text: String

    public struct Refusal: Error, Equatable, CustomStringConvertible {
        public let description: String
    }

    static let monthNames = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    static let dayNames = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]

    public init(_ text: String) throws(Refusal) {
        self.text = text
        guard text.utf8.count <= 256 else { throw Refusal(description: "is longer than 256 characters") }
        var expr = text.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        if expr.count == 1, let first = expr.first, first.hasPrefix("@") {
            switch first.lowercased() {
            case "@yearly", "@annually": expr = ["0", "0", "1", "1", "*"]
            case "@monthly": expr = ["0", "0", "1", "*", "*"]
            case "@weekly": expr = ["0", "0", "*", "*", "0"]
            case "@daily", "@midnight": expr = ["0", "0", "*", "*", "*"]
            case "@hourly": expr = ["0", "*", "*", "*", "*"]
            default: throw Refusal(description: "\(first) is not one of @yearly @annually @monthly @weekly @daily @midnight @hourly")
            }
        }
        guard expr.count == 5 || expr.count == 6 else {
            throw Refusal(description: "has \(expr.count) fields; 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)")
        }
        if expr.count == 5 { expr.insert("0", at: 0) }
        seconds = try Self.field(expr[0], "second", 0...59, names: nil)
        minutes = try Self.field(expr[1], "minute", 0...59, names: nil)
        hours = try Self.field(expr[2], "hour", 0...23, names: nil)
        daysOfMonth = try Self.field(expr[3], "day-of-month", 1...31, names: nil)
        months = try Self.field(expr[4], "month", 1...12, names: Self.monthNames, nameBase: 1)
        var dow = try Self.field(expr[5], "day-of-week", 0...7, names: Self.dayNames, nameBase: 0)
        // 7 is Sunday too.
        if dow & (1 << 7) != 0 { dow = (dow | 1) & ~(1 << 7) }
        daysOfWeek = dow
        domRestricted = !expr[3].hasPrefix("*") && expr[3] != "?"
        dowRestricted = !expr[5].hasPrefix("*") && expr[5] != "?"
        hourFollowsElapsedTime = expr[2].hasPrefix("*")
        // A day-of-month no chosen month has (e.g. 30 2 only) never matches.
        if domRestricted && !dowRestricted {
            var possible = false
            for m in 1...12 where months & (1 << m) != 0 {
                let longest = m == 2 ? 29 : [4, 6, 9, 11].contains(m) ? 30 : 31
                if (1...longest).contains(where: { daysOfMonth & (1 << $0) != 0 }) { possible = true }
            }
            guard possible else { throw Refusal(description: "never matches: no chosen month has the chosen day-of-month") }
        }
    }

    private static func field(_ text: String, _ what: String, _ range: ClosedRange<Int>, names: [String]?, nameBase: Int = 0) throws(Refusal)
        -> UInt64
    {
        func value(_ s: Substring) throws(Refusal) -> Int {
            if let n = Int(s), range.contains(n), s.allSatisfy(\.isASCII) { return n }
            if let names, let i = names.firstIndex(of: s.lowercased()) { return i + nameBase }
            throw Refusal(description: "\(what) '\(s)' is not \(range.lowerBound)-\(range.upperBound)\(names == nil ? "" : " or a name")")
        }
        var bits: UInt64 = 0
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            guard !part.isEmpty else { throw Refusal(description: "\(what) has an empty list item") }
            var base = part
            var step = 1
            if let slash = part.firstIndex(of: "/") {
                base = part[..<slash]
                let s = part[part.index(after: slash)...]
                guard let n = Int(s), n >= 1, n <= range.upperBound + 1, s.allSatisfy(\.isASCII) else {
                    throw Refusal(description: "\(what) step '\(s)' is not 1-\(range.upperBound + 1)")
                }
                step = n
            }
            var lo: Int, hi: Int
            if base == "*" || base == "?" {
                lo = range.lowerBound
                hi = range.upperBound
            } else if let dash = base.firstIndex(of: "-") {
                lo = try value(base[..<dash])
                hi = try value(base[base.index(after: dash)...])
                guard lo <= hi else { throw Refusal(description: "\(what) range '\(base)' runs backwards") }
            } else {
                lo = try value(base)
                // `5/15`: from 5 to the end, every 15.
                hi = step > 1 ? range.upperBound : lo
            }
            var v = lo
            while v <= hi {
                bits |= 1 << UInt64(v)
                v += step
            }
        }
        return bits
    }

    /// Whether the day (days since 1970) matches the day fields.
    func matchesDay(_ day: Int64) -> Bool {
        let (_, m, d) = Civil.date(day)
        guard months & (1 << m) != 0 else { return false }
        let domOK = daysOfMonth & (1 << d) != 0
        let dowOK = daysOfWeek & (1 << Civil.weekday(day)) != 0
        if domRestricted && dowRestricted { return domOK || dowOK }
        return domOK && dowOK
    }

    /// The first matching local time (seconds since 1970, wall clock) after `local`; nil when
    /// there is none within 30 years.
    public func next(after local: Int64) -> Int64? {
        var day = Civil.floorDiv(local, 86_400)
        var from = local - day * 86_400 + 1  // the first second of that day still possible
        for _ in 0..<(366 * 30) {
            if matchesDay(day), let t = firstTime(from: Int(from)) { return day * 86_400 + Int64(t) }
            day += 1
            from = 0
        }
        return nil
    }

    /// The first second of a day at or after `from` (seconds into the day) that matches.
    private func firstTime(from: Int) -> Int? {
        guard from < 86_400 else { return nil }
        var h = from / 3600, m = (from % 3600) / 60, s = from % 60
        while h < 24 {
            if hours & (1 << h) != 0 {
                while m < 60 {
                    if minutes & (1 << m) != 0 {
                        while s < 60 {
                            if seconds & (1 << s) != 0 { return h * 3600 + m * 60 + s }
                            s += 1
                        }
                    }
                    m += 1
                    s = 0
                }
            }
            h += 1
            m = 0
            s = 0
        }
        return nil
    }
}
