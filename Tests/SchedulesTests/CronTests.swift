import Schedules
import Testing

@Suite struct CronTests {
    /// Seconds of a UTC wall time.
    static func t(_ y: Int, _ mo: Int, _ d: Int, _ h: Int = 0, _ mi: Int = 0, _ s: Int = 0) -> Int64 {
        var days = Int64(0)
        for year in 1970..<y { days += (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 366 : 365 }
        let lengths = [31, (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        for m in 0..<(mo - 1) { days += Int64(lengths[m]) }
        days += Int64(d - 1)
        return days * 86_400 + Int64(h * 3600 + mi * 60 + s)
    }

    func nexts(_ expr: String, from: Int64, _ n: Int) throws -> [Int64] {
        let c = try Cron(expr)
        var out: [Int64] = []
        var at = from
        for _ in 0..<n {
            guard let x = c.next(after: at) else { break }
            out.append(x)
            at = x
        }
        return out
    }

    @Test func fieldsListsRangesStepsAndNames() throws {
        let from = Self.t(2026, 1, 1)  // a Thursday
        #expect(try nexts("*/20 9-10 * * *", from: from, 3) == [Self.t(2026, 1, 1, 9), Self.t(2026, 1, 1, 9, 20), Self.t(2026, 1, 1, 9, 40)])
        #expect(try nexts("0 0 * JAN,feb MON", from: from, 2) == [Self.t(2026, 1, 5), Self.t(2026, 1, 12)])
        #expect(try nexts("30 15 10 * * *", from: from, 2) == [Self.t(2026, 1, 1, 10, 15, 30), Self.t(2026, 1, 2, 10, 15, 30)], "6 fields: seconds first")
        #expect(try nexts("@monthly", from: from, 2) == [Self.t(2026, 2, 1), Self.t(2026, 3, 1)])
        #expect(try nexts("@hourly", from: from, 1) == [Self.t(2026, 1, 1, 1)])
        #expect(try nexts("0 12 * * 7", from: from, 1) == [Self.t(2026, 1, 4, 12)], "7 is Sunday too")
        #expect(try nexts("0 0 29 2 *", from: from, 1) == [Self.t(2028, 2, 29)], "the next leap day")
        #expect(try nexts("5/15 * * * *", from: from, 3) == [Self.t(2026, 1, 1, 0, 5), Self.t(2026, 1, 1, 0, 20), Self.t(2026, 1, 1, 0, 35)])
    }

    @Test func dayOfMonthAndDayOfWeekAsVixieCron() throws {
        // Both restricted: either matches (the 13th, or any Friday).
        let from = Self.t(2026, 2, 1)
        #expect(try nexts("0 0 13 * FRI", from: from, 3) == [Self.t(2026, 2, 6), Self.t(2026, 2, 13), Self.t(2026, 2, 20)])
        // One restricted: that one alone.
        #expect(try nexts("0 0 13 * *", from: from, 1) == [Self.t(2026, 2, 13)])
        #expect(try nexts("0 0 * * FRI", from: from, 1) == [Self.t(2026, 2, 6)])
    }

    @Test func refusalsSayWhat() {
        for (expr, words) in [
            ("* * * *", "4 fields"), ("60 * * * *", "minute '60'"), ("* 24 * * *", "hour '24'"), ("* * 0 * *", "day-of-month '0'"),
            ("* * * 13 *", "month '13'"), ("* * * * 8", "day-of-week '8'"), ("*/0 * * * *", "step '0'"), ("5-1 * * * *", "backwards"),
            ("0 0 30 2 *", "never matches"), ("@often", "@often"), ("1,,2 * * * *", "empty"), ("x * * * *", "minute 'x'"),
        ] {
            #expect(throws: Cron.Refusal.self, "\(expr)") { try Cron(expr) }
            do { _ = try Cron(expr) } catch { #expect(error.description.contains(words), "\(expr): \(error)") }
        }
    }

    @Test func zonesComeFromTheSystemDatabase() throws {
        #expect(Zone.load("Europe/Berlin") != nil)
        #expect(Zone.load("UTC")?.offset(at: 0) == 0)
        for bad in ["Nowhere/City", "../etc/passwd", "/etc/passwd", "Europe/../../etc/passwd", "", "Europe/Berlin\u{0}", String(repeating: "a", count: 65)] {
            #expect(Zone.load(bad) == nil, "\(bad)")
        }
        let berlin = try #require(Zone.load("Europe/Berlin"))
        #expect(berlin.offset(at: Self.t(2026, 7, 1)) == 7200 && berlin.offset(at: Self.t(2026, 1, 1)) == 3600)
        // Beyond the file's last transition, the footer's rule: summer in 2090 too.
        #expect(berlin.offset(at: Self.t(2090, 7, 1)) == 7200 && berlin.offset(at: Self.t(2090, 12, 1)) == 3600)
        let lordHowe = try #require(Zone.load("Australia/Lord_Howe"))
        #expect(lordHowe.offset(at: Self.t(2090, 1, 1)) == 39_600 && lordHowe.offset(at: Self.t(2090, 7, 1)) == 37_800, "+11:00 in summer, +10:30 in winter")
    }
}
