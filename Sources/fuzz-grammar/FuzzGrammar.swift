import Foundation
import FuzzMain
import Grammar

/// `fuzz-grammar`: every input through both of the client-text grammars, each checked against
/// an oracle that shares none of its code.
///
/// - Numbers (``DecimalNumber``): the oracle is the grammar written as two regular
///   expressions, and the value it should give is Swift's own `Int`/`UInt64`/`Double` parse
///   of a text the expression matched (where those parsers are exact).
/// - Dates (``RFC3339``): the oracle splits the fields with a regular expression and asks
///   Foundation's Gregorian `Calendar` whether they name a date that exists
///   (`DateComponents.isValidDate(in:)`), then takes its seconds from `Calendar.date(from:)`.
///
/// The parser and its oracle must agree on acceptance, on the value, and on the kind of
/// refusal (malformed, no such date, or out of range). Any disagreement traps, so libFuzzer
/// reports it with the input.
///
/// Built normally it replays files (`fuzz-grammar FILE|DIR...`, default
/// `Fuzz/corpus/grammar`); built with `-sanitize=fuzzer,address` it is a libFuzzer binary.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzGrammar(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    FuzzGrammar.one(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

enum FuzzGrammar {
    // Regular expressions are anchored with \A and \z: `$` would also match before a final
    // newline. `[0-9]` is ASCII only (ICU's \d is every Unicode digit).
    static let integerPattern = try! NSRegularExpression(pattern: #"\A-?(0|[1-9][0-9]*)\z"#)
    static let decimalPattern = try! NSRegularExpression(pattern: #"\A-?(0|[1-9][0-9]*)(\.[0-9]+)?\z"#)
    static let datePattern = try! NSRegularExpression(
        pattern: #"\A([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))\z"#)

    nonisolated(unsafe) static let utc: ISO8601DateFormatter = {  // libFuzzer calls in from one thread
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        f.timeZone = TimeZone(identifier: "UTC")
        return f
    }()

    static let calendar: Calendar = {
        var c = Calendar(identifier: .gregorian)
        c.timeZone = TimeZone(identifier: "UTC")!
        return c
    }()

    static func one(_ input: [UInt8]) {
        let text = String(decoding: input, as: UTF8.self)
        checkNumbers(text)
        checkDate(text)
        // Both again on the input's lines, so one input of the corpus exercises many values.
        if input.contains(0x0A) {
            for line in text.split(separator: "\n", omittingEmptySubsequences: false).prefix(16) {
                checkNumbers(String(line))
                checkDate(String(line))
            }
        }
    }

    static func matches(_ re: NSRegularExpression, _ s: String) -> Bool {
        re.firstMatch(in: s, range: NSRange(s.startIndex..., in: s)) != nil
    }

    // MARK: Numbers

    static func checkNumbers(_ text: String) {
        let isInteger = matches(integerPattern, text)
        let isDecimal = matches(decimalPattern, text)
        check(isInteger ? isDecimal : true, "the integer grammar is part of the decimal one: \(text.debugDescription)")

        let negative = text.hasPrefix("-")
        for range in [0...Int.max, 1...1000, -1...1_000_000, Int.min...Int.max] {
            let got = DecimalNumber.integer(text, in: range)
            if isInteger && negative && range.lowerBound >= 0 {
                check(got == .failure(.minusSign), "integer \(text.debugDescription) for \(range) should be refused for its '-': \(got)")
            } else if isInteger {
                // Swift's Int(_:) is exact on plain decimal digits; nil means past Int's range.
                let expected = Int(text)
                switch got {
                case let .success(v):
                    check(expected == v && range.contains(v), "integer \(text.debugDescription) gave \(v), expected \(String(describing: expected))")
                case .failure(.outOfRange): check(expected.map { !range.contains($0) } ?? true, "integer \(text.debugDescription) refused as out of \(range)")
                case let .failure(r): fail("integer \(text.debugDescription) is in the grammar but was refused: \(r)")
                }
            } else {
                if case let .success(v) = got { fail("integer \(text.debugDescription) is not in the grammar but gave \(v)") }
                if case .failure(.outOfRange) = got { fail("integer \(text.debugDescription) is not in the grammar but was called out of range") }
            }
        }

        let unsigned = DecimalNumber.unsigned(text)
        if isInteger && negative {
            check(unsigned == .failure(.minusSign), "unsigned \(text.debugDescription) should be refused for its '-': \(unsigned)")
        } else if isInteger {
            let expected = UInt64(text)
            switch unsigned {
            case let .success(v): check(expected == v, "unsigned \(text.debugDescription) gave \(v), expected \(String(describing: expected))")
            case .failure(.outOfRange): check(expected == nil, "unsigned \(text.debugDescription) refused as out of range")
            case let .failure(r): fail("unsigned \(text.debugDescription) is in the grammar but was refused: \(r)")
            }
        } else if case .success = unsigned {
            fail("unsigned \(text.debugDescription) is not in the grammar but was accepted")
        }

        // Ranges as the API and the flags use them, plus negative and fractional bounds. Whole
        // bounds are exact (compared digit by digit below, not through Double); a fractional
        // bound compares the correctly rounded value, as documented.
        let ranges: [(low: String, high: String)] = [
            ("0", "300"), ("0", "3600"), ("1", "3600"), ("0.01", "3600"), ("0.1", "86400"), ("-5", "0"), ("-5", "-1"),
            ("0", "1e308"), ("-1e308", "1e308"),
        ]
        for (lowText, highText) in ranges {
            guard let low = Double(lowText), let high = Double(highText) else { fail("bad range"); return }
            let got = DecimalNumber.decimal(text, in: low...high)
            if isDecimal && negative && low >= 0 {
                check(got == .failure(.minusSign), "decimal \(text.debugDescription) for \(lowText)...\(highText) should be refused for its '-': \(got)")
            } else if isDecimal {
                // Swift's Double(_:) rounds plain decimal text correctly (to infinity past its range).
                let expected = Double(text).map { $0 == 0 ? 0 : $0 }
                func exact(_ bound: String) -> Bool { !bound.contains("e") && !bound.contains(".") }
                let aboveLow = exact(lowText) ? compareDecimal(text, lowText) >= 0 : (expected.map { $0 >= low } ?? false)
                let belowHigh = exact(highText) ? compareDecimal(text, highText) <= 0 : (expected.map { $0 <= high } ?? false)
                let inRange = (expected?.isFinite ?? false) && aboveLow && belowHigh
                switch got {
                case let .success(v):
                    check(
                        expected == v && inRange,
                        "decimal \(text.debugDescription) in \(lowText)...\(highText) gave \(v), expected \(String(describing: expected))")
                case .failure(.outOfRange): check(!inRange, "decimal \(text.debugDescription) refused as out of \(lowText)...\(highText)")
                case let .failure(r): fail("decimal \(text.debugDescription) is in the grammar but was refused: \(r)")
                }
            } else {
                if case let .success(v) = got { fail("decimal \(text.debugDescription) is not in the grammar but gave \(v)") }
                if case .failure(.outOfRange) = got { fail("decimal \(text.debugDescription) is not in the grammar but was called out of range") }
            }
        }
    }

    /// The sign of a - b for two texts of the decimal grammar (`-?digits(.digits)?`), exactly,
    /// digit by digit: no Double, no parser code.
    static func compareDecimal(_ a: String, _ b: String) -> Int {
        func parts(_ s: String) -> (negative: Bool, whole: [UInt8], fraction: [UInt8]) {
            var bytes = Array(s.utf8)
            let negative = bytes.first == UInt8(ascii: "-")
            if negative { bytes.removeFirst() }
            let split = bytes.split(separator: UInt8(ascii: "."), maxSplits: 1, omittingEmptySubsequences: false)
            var whole = Array(split[0])
            while whole.count > 1 && whole[0] == UInt8(ascii: "0") { whole.removeFirst() }
            var fraction = split.count > 1 ? Array(split[1]) : []
            while fraction.last == UInt8(ascii: "0") { fraction.removeLast() }
            let isZero = whole == [UInt8(ascii: "0")] && fraction.isEmpty
            return (negative && !isZero, whole, fraction)
        }
        func magnitudeCompare(_ x: ([UInt8], [UInt8]), _ y: ([UInt8], [UInt8])) -> Int {
            if x.0.count != y.0.count { return x.0.count < y.0.count ? -1 : 1 }
            if x.0 != y.0 { return x.0.lexicographicallyPrecedes(y.0) ? -1 : 1 }
            let n = max(x.1.count, y.1.count)
            let xf = x.1 + Array(repeating: UInt8(ascii: "0"), count: n - x.1.count)
            let yf = y.1 + Array(repeating: UInt8(ascii: "0"), count: n - y.1.count)
            if xf == yf { return 0 }
            return xf.lexicographicallyPrecedes(yf) ? -1 : 1
        }
        let (x, y) = (parts(a), parts(b))
        if x.negative != y.negative { return x.negative ? -1 : 1 }
        let c = magnitudeCompare((x.whole, x.fraction), (y.whole, y.fraction))
        return x.negative ? -c : c
    }

    // MARK: Dates

    static func checkDate(_ text: String) {
        let got = RFC3339.nanoseconds(text)
        let ns = text as NSString
        guard let m = datePattern.firstMatch(in: text, range: NSRange(location: 0, length: ns.length)) else {
            if case let .success(v) = got { fail("date \(text.debugDescription) does not match RFC 3339's grammar but gave \(v)") }
            if case .failure(let r) = got, !isSyntax(r) { fail("date \(text.debugDescription) does not match the grammar but was refused as \(r)") }
            return
        }
        func group(_ i: Int) -> String? {
            let r = m.range(at: i)
            return r.location == NSNotFound ? nil : ns.substring(with: r)
        }
        func int(_ i: Int) -> Int { group(i).flatMap { Int($0) } ?? -1 }
        let (year, month, day, hour, minute, second) = (int(1), int(2), int(3), int(4), int(5), int(6))
        var offset = 0
        var offsetValid = true
        if group(8) == nil {
            let (oh, om) = (int(10), int(11))
            offsetValid = oh <= 23 && om <= 59
            offset = (group(9) == "-" ? -1 : 1) * (oh * 3600 + om * 60)
        }
        // The fraction's nanoseconds: its first nine digits, padded with zeros.
        let fraction = group(7).map { String(($0 + "000000000").prefix(9)) }.flatMap { Int($0) } ?? 0

        // Foundation decides which dates exist. Year 0 and below are outside what the
        // Gregorian calendar's era 1 holds, and outside the accepted years anyway; between
        // 1583 and 9999 the proleptic and historical calendars agree.
        var components = DateComponents()
        components.calendar = calendar
        components.timeZone = calendar.timeZone
        (components.year, components.month, components.day) = (year, month, day)
        (components.hour, components.minute, components.second) = (hour, minute, second)
        let calendarSaysValid = components.isValidDate(in: calendar) && second <= 59

        if !offsetValid {
            // The whole syntax is read before the calendar is checked, so the offset is named first.
            switch got {
            case let .success(v): fail("date \(text.debugDescription) has an offset past 23:59 but gave \(v)")
            case .failure(.offset): break
            case let .failure(r): fail("date \(text.debugDescription) has an offset past 23:59 but was refused as \(r)")
            }
            return
        }
        if year < 1583 {
            // Before the Gregorian calendar, Foundation's answer is about another calendar; the
            // parser must refuse (the years before 1970 are out of range) for some reason.
            if case let .success(v) = got { fail("date \(text.debugDescription) before 1583 gave \(v)") }
            return
        }
        guard calendarSaysValid else {
            switch got {
            case let .success(v): fail("Calendar says \(text.debugDescription) does not exist, the parser gave \(v)")
            case let .failure(r): check(isCalendar(r), "Calendar says \(text.debugDescription) does not exist; the parser refused it as \(r)")
            }
            return
        }
        guard let date = calendar.date(from: components) else { fail("Calendar could not make a date of valid \(text.debugDescription)"); return }
        let seconds = Int64(date.timeIntervalSince1970.rounded()) - Int64(offset)
        // The years 1970 to 2261 both as written and in UTC: 2262-01-01T00:00:00Z is 9214646400 s.
        let writtenInRange = (1970...2261).contains(year)
        let instantInRange = seconds >= 0 && seconds < 9_214_646_400
        switch got {
        case let .success(v):
            check(writtenInRange && instantInRange, "date \(text.debugDescription) out of range was accepted as \(v)")
            check(v == seconds * 1_000_000_000 + Int64(fraction), "date \(text.debugDescription) gave \(v), Calendar says \(seconds) s + \(fraction) ns")
            // What the API writes back (UTC, milliseconds), written here by Foundation, must be
            // read again: an archive exported with this time restores.
            let ms = v / 1_000_000
            let back = utc.string(from: Date(timeIntervalSince1970: Double(ms) / 1000))
            switch RFC3339.nanoseconds(back) {
            case let .success(again): check(abs(again / 1_000_000 - ms) <= 1, "date \(text.debugDescription) written back as \(back) reads as \(again)")
            case let .failure(r): fail("date \(text.debugDescription) was accepted, but written back as \(back) it is refused: \(r)")
            }
        case .failure(.outOfRange): check(!writtenInRange, "date \(text.debugDescription) with its year in range was refused as out of range")
        case .failure(.outOfRangeInUTC):
            check(writtenInRange && !instantInRange, "date \(text.debugDescription) (\(seconds) s) was refused as out of range in UTC")
        case let .failure(r): fail("valid date \(text.debugDescription) was refused: \(r)")
        }
    }

    static func isSyntax(_ r: RFC3339.Refusal) -> Bool {
        switch r {
        case .syntax, .offset: return true
        default: return false
        }
    }

    static func isCalendar(_ r: RFC3339.Refusal) -> Bool {
        switch r {
        case .month, .day, .hour, .minute, .second: return true
        default: return false
        }
    }

    static func check(_ ok: Bool, _ message: @autoclosure () -> String) {
        if !ok { fail(message()) }
    }

    static func fail(_ message: String) {
        FileHandle.standardError.write(Data("fuzz-grammar: \(message)\n".utf8))
        abort()
    }
}

@main enum FuzzGrammarMain {
    static func main() {
        FuzzMain.run("fuzz-grammar", defaultCorpus: "Fuzz/corpus/grammar", callback: fuzzGrammar, one: FuzzGrammar.one)
    }
}
