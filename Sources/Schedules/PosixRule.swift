/// A POSIX TZ rule, as a TZif footer carries it for every time after the file's last
/// transition: `EST5EDT,M3.2.0,M11.1.0`, `CET-1CEST,M3.5.0,M10.5.0/3`,
/// `<+1030>-10:30<+11>-11,M10.1.0,M4.1.0`. Offsets here are seconds east of UTC (POSIX writes
/// them west).
struct PosixRule: Sendable, Equatable {
    var std: Int32
    var dst: Int32?
    var start: Day = .weekday(month: 3, week: 2, day: 0)
    var startTime: Int32 = 7200
    var end: Day = .weekday(month: 11, week: 1, day: 0)
    var endTime: Int32 = 7200

    enum Day: Sendable, Equatable {
        /// `Jn`: day 1...365, February 29 never counted.
        case julian(Int)
        /// `n`: day 0...365, February 29 counted.
        case zeroBased(Int)
        /// `Mm.w.d`: weekday `d` (0 Sunday) of week `w` (5: the last) of month `m`.
        case weekday(month: Int, week: Int, day: Int)
    }

    init?(_ text: String) {
        var s = Array(text.utf8)[...]
        guard Self.name(&s), let stdWest = Self.offset(&s) else { return nil }
        std = -stdWest
        guard !s.isEmpty else { dst = nil; return }
        guard Self.name(&s) else { return nil }
        if let f = s.first, f != UInt8(ascii: ",") {
            guard let d = Self.offset(&s) else { return nil }
            dst = -d
        } else {
            dst = std + 3600
        }
        guard s.popFirst() == UInt8(ascii: ","), let a = Self.day(&s) else { return nil }
        start = a
        if s.first == UInt8(ascii: "/") {
            s.removeFirst()
            guard let t = Self.offset(&s) else { return nil }
            startTime = t
        }
        guard s.popFirst() == UInt8(ascii: ","), let b = Self.day(&s) else { return nil }
        end = b
        if s.first == UInt8(ascii: "/") {
            s.removeFirst()
            guard let t = Self.offset(&s) else { return nil }
            endTime = t
        }
        guard s.isEmpty else { return nil }
    }

    // MARK: - reading it

    private static func name(_ s: inout ArraySlice<UInt8>) -> Bool {
        if s.first == UInt8(ascii: "<") {
            guard let close = s.firstIndex(of: UInt8(ascii: ">")) else { return false }
            s = s[(close + 1)...]
            return true
        }
        var n = 0
        while let c = s.first, (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) {
            s.removeFirst()
            n += 1
        }
        return n >= 3
    }

    /// `[+-]hh[:mm[:ss]]` in seconds (hours up to 167, as the extended form allows).
    private static func offset(_ s: inout ArraySlice<UInt8>) -> Int32? {
        var sign: Int32 = 1
        if s.first == UInt8(ascii: "+") {
            s.removeFirst()
        } else if s.first == UInt8(ascii: "-") {
            sign = -1
            s.removeFirst()
        }
        guard let h = number(&s, max: 167) else { return nil }
        var total = h * 3600
        for unit in [Int32(60), 1] {
            guard s.first == UInt8(ascii: ":") else { break }
            s.removeFirst()
            guard let v = number(&s, max: 59) else { return nil }
            total += v * unit
        }
        return sign * total
    }

    private static func number(_ s: inout ArraySlice<UInt8>, max: Int32) -> Int32? {
        var v: Int32 = 0
        var n = 0
        while let c = s.first, c >= 0x30 && c <= 0x39, n < 3 {
            v = v * 10 + Int32(c - 0x30)
            s.removeFirst()
            n += 1
        }
        return n > 0 && v <= max ? v : nil
    }

    private static func day(_ s: inout ArraySlice<UInt8>) -> Day? {
        switch s.first {
        case UInt8(ascii: "M")?:
            s.removeFirst()
            guard let m = number(&s, max: 12), m >= 1, s.popFirst() == UInt8(ascii: "."), let w = number(&s, max: 5), w >= 1,
                s.popFirst() == UInt8(ascii: "."), let d = number(&s, max: 6)
            else { return nil }
            return .weekday(month: Int(m), week: Int(w), day: Int(d))
        case UInt8(ascii: "J")?:
            s.removeFirst()
            guard let n = number(&s, max: 365), n >= 1 else { return nil }
            return .julian(Int(n))
        default:
            guard let n = number(&s, max: 365) else { return nil }
            return .zeroBased(Int(n))
        }
    }

    // MARK: - offsets

    func offset(at utc: Int64) -> Int32 {
        guard let dst else { return std }
        let year = Civil.year(of: utc &+ Int64(std))
        let (a, b) = transitions(year)
        let inDST = a < b ? (utc >= a && utc < b) : !(utc >= b && utc < a)
        return inDST ? dst : std
    }

    /// The instants daylight time starts and ends in `year`.
    func transitions(_ year: Int) -> (start: Int64, end: Int64) {
        let dst = self.dst ?? std
        let a = Civil.seconds(ofDay: Self.dayNumber(start, year)) &+ Int64(startTime) &- Int64(std)
        let b = Civil.seconds(ofDay: Self.dayNumber(end, year)) &+ Int64(endTime) &- Int64(dst)
        return (a, b)
    }

    func lastTransition(atOrBefore utc: Int64) -> Int64? {
        guard dst != nil else { return nil }
        let year = Civil.year(of: utc)
        var best: Int64?
        for y in (year - 1)...(year + 1) {
            let (a, b) = transitions(y)
            for t in [a, b] where t <= utc && t > (best ?? .min) { best = t }
        }
        return best
    }

    /// Days since 1970 of `day` in `year`.
    static func dayNumber(_ day: Day, _ year: Int) -> Int64 {
        let jan1 = Civil.days(year: year, month: 1, day: 1)
        switch day {
        case let .julian(n):
            // February 29 is never counted: from March on, a leap year's day is one later.
            return jan1 + Int64(n - 1) + (Civil.isLeap(year) && n >= 60 ? 1 : 0)
        case let .zeroBased(n):
            return jan1 + Int64(n)
        case let .weekday(month, week, d):
            let first = Civil.days(year: year, month: month, day: 1)
            // 1970-01-01 was a Thursday (4).
            let firstWeekday = Int((first % 7 + 7 + 4) % 7)
            var dayOfMonth = 1 + (d - firstWeekday + 7) % 7 + (week - 1) * 7
            let length = Civil.monthLength(year, month)
            while dayOfMonth > length { dayOfMonth -= 7 }
            return first + Int64(dayOfMonth - 1)
        }
    }
}

/// Proleptic Gregorian dates as days and seconds since 1970-01-01.
enum Civil {
    static func isLeap(_ y: Int) -> Bool { (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 }

    static func monthLength(_ y: Int, _ m: Int) -> Int {
        switch m {
        case 2: return isLeap(y) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    static func days(year: Int, month: Int, day: Int) -> Int64 {
        let y = Int64(month <= 2 ? year - 1 : year)
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = Int64((month + 9) % 12)
        let doy = (153 * mp + 2) / 5 + Int64(day) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    static func seconds(ofDay d: Int64) -> Int64 { d &* 86_400 }

    /// (year, month, day) of day `z` since 1970.
    static func date(_ z0: Int64) -> (year: Int, month: Int, day: Int) {
        let z = z0 + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (Int(m <= 2 ? y + 1 : y), Int(m), Int(d))
    }

    static func year(of seconds: Int64) -> Int { date(floorDiv(seconds, 86_400)).year }

    static func floorDiv(_ a: Int64, _ b: Int64) -> Int64 { a >= 0 ? a / b : -((-a + b - 1) / b) }

    /// 0 Sunday ... 6 Saturday of day `z` since 1970.
    static func weekday(_ z: Int64) -> Int { Int(((z % 7) + 7 + 4) % 7) }
}
