import QueueKinds
import Testing

extension KindsTests {
    /// `Retry-After` as RFC 9110 §10.2.3 writes it: delta-seconds or one of the three HTTP-date
    /// forms, read strictly, and total on anything a target (or a fuzzer) sends.
    @Suite struct RetryAfterParsing {
        /// Sun, 06 Nov 1994 08:49:37 GMT, the RFC's example date.
        let now = 784_111_777.0

        func wait(_ value: String, now: Double? = nil) -> Double? { RetryAfter.seconds(value, now: now ?? self.now) }

        @Test func secondsAreReadAsTheyAre() {
            #expect(wait("120") == 120)
            #expect(wait("0") == 0)
            #expect(wait(" 7\t") == 7, "surrounding whitespace is not part of the value")
            #expect(wait("0000000000000000000000000000000000000000000000000000000000000000000000000007") == 7, "leading zeros, however many")
            #expect(wait("9223372035") == 9_223_372_035)
        }

        @Test func hugeSecondsSaturateInsteadOfTrapping() {
            #expect(wait("9223372036") == RetryAfter.maxSeconds)
            #expect(wait("9223372037") == RetryAfter.maxSeconds)
            #expect(wait("18446744073709551616") == RetryAfter.maxSeconds, "past UInt64")
            #expect(wait(String(repeating: "9", count: 400)) == RetryAfter.maxSeconds, "past Double's range")
            #expect(wait(String(repeating: "9", count: 100_000)) == RetryAfter.maxSeconds, "any length")
            // A caller may count the longest wait in Int64 nanoseconds.
            #expect(RetryAfter.maxSeconds * 1e9 < Double(Int64.max))
        }

        @Test func theThreeDateFormsGiveSecondsFromNow() {
            #expect(wait("Sun, 06 Nov 1994 08:50:37 GMT") == 60, "IMF-fixdate")
            #expect(wait("Sunday, 06-Nov-94 08:51:37 GMT") == 120, "RFC 850")
            #expect(wait("Sun Nov  6 08:52:37 1994") == 180, "asctime, a one-digit day")
            #expect(wait("Wed Nov 16 08:49:37 1994") == 864_000, "asctime, a two-digit day")
            #expect(wait("Sun Nov 06 08:49:38 1994") == 1, "asctime, a two-digit day with a zero")
            #expect(wait("Mon, 07 Nov 1994 08:49:37 GMT") == 86_400)
            #expect(wait("Sat, 01 Jan 2000 00:00:00 GMT") == 946_684_800 - now, "a year boundary and a leap century")
            #expect(wait("Sun, 06 Nov 1994 08:49:37 GMT") == 0, "now")
        }

        @Test func aDateInThePastMeansAtOnce() {
            #expect(wait("Sun, 06 Nov 1994 07:49:37 GMT") == 0)
            #expect(wait("Thu, 01 Jan 1970 00:00:00 GMT") == 0)
            #expect(wait("Mon, 01 Jan 0001 00:00:00 GMT") == 0)
            #expect(wait("Sunday, 06-Nov-94 08:49:36 GMT") == 0)
            #expect(wait("Sun Nov  6 08:49:36 1994") == 0)
        }

        @Test func aDateFarAheadIsCutToTheLongestWait() {
            #expect(wait("Fri, 31 Dec 9999 23:59:59 GMT") == RetryAfter.maxSeconds)
        }

        @Test func leapDaysAndSecondsAreRealDatesOnly() {
            #expect(wait("Thu, 29 Feb 1996 00:00:00 GMT") != nil, "1996 is a leap year")
            #expect(wait("Tue, 29 Feb 2000 00:00:00 GMT") != nil, "2000 is a leap year (divisible by 400)")
            #expect(wait("Sun, 06 Nov 1994 08:49:60 GMT") == 23, "a leap second is a time")
            for bad in [
                "Thu, 29 Feb 1900 00:00:00 GMT",  // divisible by 100, not by 400
                "Wed, 29 Feb 1995 00:00:00 GMT",
                "Mon, 30 Feb 1995 00:00:00 GMT",
                "Fri, 31 Apr 1995 00:00:00 GMT",
                "Sun, 31 Nov 1994 00:00:00 GMT",
                "Sun, 00 Nov 1994 00:00:00 GMT",
                "Sun, 32 Jan 1995 00:00:00 GMT",
                "Sun, 06 Nov 0000 08:49:37 GMT",
                "Sun, 06 Nov 1994 24:00:00 GMT",
                "Sun, 06 Nov 1994 23:60:00 GMT",
                "Sun, 06 Nov 1994 23:59:61 GMT",
                "Wednesday, 30-Feb-95 00:00:00 GMT",
                "Sun Nov 31 08:49:37 1994",
                "Sun Feb 29 08:49:37 1900",
            ] {
                #expect(wait(bad) == nil, "\(bad)")
            }
        }

        @Test func anRFC850YearIsTheOneAtMostFiftyYearsAhead() {
            // 2000-01-01T00:00:00Z: the first second of a year, where an average-year estimate
            // of the current year still says 1999.
            let y2k = 946_684_800.0
            #expect(wait("Saturday, 01-Jan-50 00:00:00 GMT", now: y2k) == wait("Sat, 01 Jan 2050 00:00:00 GMT", now: y2k))
            #expect(wait("Saturday, 01-Jan-50 00:00:00 GMT", now: y2k).map { $0 > 0 } == true, "2050, not 1950")
            #expect(wait("Sunday, 01-Jan-51 00:00:00 GMT", now: y2k) == 0, "more than 50 years ahead: 1951")
            #expect(wait("Monday, 01-Jan-01 00:00:00 GMT", now: y2k) == wait("Mon, 01 Jan 2001 00:00:00 GMT", now: y2k))
            #expect(wait("Friday, 31-Dec-99 23:59:59 GMT", now: y2k) == 0, "1999")
            // The last second of 1999: the century is still 19xx.
            #expect(wait("Monday, 01-Jan-49 00:00:00 GMT", now: y2k - 1) == wait("Fri, 01 Jan 2049 00:00:00 GMT", now: y2k - 1))
            #expect(wait("Saturday, 01-Jan-50 00:00:00 GMT", now: y2k - 1) == 0, "2050 is more than 50 years after 1999: 1950")
            // In 2060 (2060-01-01T00:00:00Z) a 05 is 2105, 45 years ahead, not 2005.
            let y2060 = 2_840_140_800.0
            #expect(wait("Tuesday, 01-Jan-05 00:00:00 GMT", now: y2060) == wait("Thu, 01 Jan 2105 00:00:00 GMT", now: y2060))
            #expect(wait("Tuesday, 01-Jan-05 00:00:00 GMT", now: y2060).map { $0 > 0 } == true)
            #expect(wait("Saturday, 01-Jan-11 00:00:00 GMT", now: y2060) == 0, "2111 is more than 50 years ahead: 2011")
        }

        @Test func garbageIsNoValue() {
            for bad in [
                "", " ", "\t", "-1", "+1", "1.5", "1e3", "0x10", "1 2", "120 s", "٣", "１２", "soon", "Infinity", "NaN",
                "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 06 Nov 1994 08:49:37 gmt", "sun, 06 Nov 1994 08:49:37 GMT", "Sun, 06 nov 1994 08:49:37 GMT",
                "Sun, 6 Nov 1994 08:49:37 GMT", "Sun,06 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT junk", "Sun, 06 Nov 94 08:49:37 GMT",
                "Sun, 06  Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 8:49:37 GMT", "Sun, 06 Nov 1994 08:49 GMT", "Sun, 06 Nov 1994 08:49:37",
                "Sun, 06 Nov 1994\t08:49:37 GMT", "Sun, 06 Nov 19a4 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT,", "Sun, -6 Nov 1994 08:49:37 GMT",
                "Funday, 06-Nov-94 08:49:37 GMT", "Sun, 06-Nov-94 08:49:37 GMT", "Sunday, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-1994 08:49:37 GMT",
                "Sun Nov 6 08:49:37 1994", "Sun Nov  6 08:49:37 94", "Sun Nov  6 08:49:37 1994 GMT", "Sunday Nov  6 08:49:37 1994",
                ",", ",,,,", "Sun,", "\u{0}", String(repeating: "a", count: 100_000),
            ] {
                #expect(wait(bad) == nil, "\(bad.prefix(60))")
            }
        }

        @Test func anyNowIsSafe() {
            for t in [Double.nan, .infinity, -.infinity] {
                #expect(wait("120", now: t) == 120, "seconds do not depend on now")
                #expect(wait("Sun, 06 Nov 1994 08:50:37 GMT", now: t) == nil, "no time from an unknown now")
                #expect(wait("Sunday, 06-Nov-94 08:51:37 GMT", now: t) == nil)
                #expect(wait("Sun Nov  6 08:52:37 1994", now: t) == nil)
            }
            for t in [-Double.greatestFiniteMagnitude, -1e300] {
                #expect(wait("Sun, 06 Nov 1994 08:50:37 GMT", now: t) == RetryAfter.maxSeconds)
                #expect(wait("Sunday, 06-Nov-94 08:51:37 GMT", now: t) == RetryAfter.maxSeconds, "a year before 1970 reads 94 as 1994")
            }
            for t in [Double.greatestFiniteMagnitude, 1e300, 3e11] {
                #expect(wait("Sun, 06 Nov 1994 08:50:37 GMT", now: t) == 0)
                #expect(wait("Sunday, 06-Nov-94 08:51:37 GMT", now: t) == 0, "a year after 9999 reads 94 as 9994")
                #expect(wait("Wednesday, 06-Nov-10 08:51:37 GMT", now: t) == nil, "... and 10 as 10010, no year of HTTP")
            }
        }

        @Test func theHeaderIsFoundInAnyCaseAndRepeatedOnlyWhenItAgrees() {
            func wait(_ headers: [(String, String)]) -> Double? { RetryAfter.seconds(in: headers, now: now) }
            #expect(wait([]) == nil)
            #expect(wait([("Content-Type", "text/plain")]) == nil)
            #expect(wait([("Retry-After", "5")]) == 5)
            #expect(wait([("RETRY-AFTER", "5")]) == 5)
            #expect(wait([("rEtRy-aFtEr", "5"), ("X", "y")]) == 5)
            #expect(wait([("Retry-After", "5"), ("retry-after", "5")]) == 5, "the same value twice")
            #expect(wait([("Retry-After", "60"), ("Retry-After", "Sun, 06 Nov 1994 08:50:37 GMT")]) == 60, "the same time, written twice")
            #expect(wait([("Retry-After", "5"), ("Retry-After", "6")]) == nil, "two times: neither is believed")
            #expect(wait([("Retry-After", "5"), ("Retry-After", "soon")]) == nil)
            #expect(wait([("Retry-After", "soon"), ("Retry-After", "5")]) == nil)
            #expect(wait([("Retry-After", "")]) == nil)
            #expect(wait([("Retry-After-Seconds", "5"), ("Retry", "5"), ("Retry_After", "5"), ("Retry-After ", "5")]) == nil)
            #expect(wait([("Retry-Afte\u{212A}", "5"), ("Retry\u{2011}After", "5")]) == nil, "non-ASCII look-alikes")
        }
    }
}
