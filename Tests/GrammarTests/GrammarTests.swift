import Foundation
import Grammar
import Testing

@Suite struct DecimalNumberTests {
    @Test(arguments: [
        ("0", 0), ("7", 7), ("1000", 1000), ("-1", -1), ("-0", 0),
        ("9223372036854775807", Int.max), ("-9223372036854775808", Int.min),
    ])
    func integersInTheGrammar(text: String, value: Int) {
        #expect(DecimalNumber.integer(text, in: Int.min...Int.max) == .success(value))
    }

    @Test(arguments: [
        ("", DecimalNumber.Refusal.empty), ("+5", .plusSign), ("0x10", .hexadecimal), ("0X10", .hexadecimal),
        ("-0x10", .hexadecimal), ("0x1p4", .hexadecimal), ("inf", .notANumber), ("-Infinity", .notANumber),
        ("nan", .notANumber), ("NaN", .notANumber), ("1e3", .exponent), ("1E3", .exponent), ("1.5", .fraction),
        ("1.", .fraction), ("010", .leadingZero), ("00", .leadingZero), ("-01", .leadingZero), (" 1", .whitespace),
        ("1 ", .whitespace), ("1\n", .whitespace), ("-", .missingDigits), (".5", .missingDigits),
        ("1_000", .unexpected(UInt8(ascii: "_"))), ("1,000", .unexpected(UInt8(ascii: ","))),
        ("١٢", .unexpected(0xD9)), ("0b101", .unexpected(UInt8(ascii: "b"))), ("0o7", .unexpected(UInt8(ascii: "o"))),
        ("9223372036854775808", .outOfRange), ("99999999999999999999999", .outOfRange),
        ("-9223372036854775809", .outOfRange),
    ])
    func integersRefused(text: String, refusal: DecimalNumber.Refusal) {
        #expect(DecimalNumber.integer(text, in: Int.min...Int.max) == .failure(refusal))
    }

    @Test func wholeBoundsAreExactAndFractionalOnesRounded() {
        // 300.00000000000000001 and 0.99999999999999999999 round onto the bound as Doubles.
        #expect(DecimalNumber.decimal("300.00000000000000001", in: 0...300) == .failure(.outOfRange))
        #expect(DecimalNumber.decimal("300.000", in: 0...300) == .success(300))
        #expect(DecimalNumber.decimal("0.99999999999999999999", in: 1...3600) == .failure(.outOfRange))
        #expect(DecimalNumber.decimal("1.0", in: 1...3600) == .success(1))
        #expect(DecimalNumber.decimal("-0.5", in: -5...0) == .success(-0.5))
        #expect(DecimalNumber.decimal("-5.00000000000000000001", in: -5...0) == .failure(.outOfRange))
        #expect(DecimalNumber.decimal("-0.99999999999999999999", in: -5...(-1)) == .failure(.outOfRange))
        #expect(DecimalNumber.decimal("-0", in: -5...(-1)) == .failure(.outOfRange))
        #expect(DecimalNumber.decimal("-0", in: -5...0) == .success(0))
        // A fractional bound compares the correctly rounded value.
        #expect(DecimalNumber.decimal("0.00999999999999999999999", in: 0.01...3600) == .success(0.01))
    }

    @Test func theRangeIsCheckedAfterTheGrammar() {
        #expect(DecimalNumber.integer("0", in: 1...100) == .failure(.outOfRange))
        #expect(DecimalNumber.integer("101", in: 1...100) == .failure(.outOfRange))
        #expect(DecimalNumber.integer("-1", in: 0...10) == .failure(.minusSign))
        #expect(DecimalNumber.integer("-0", in: 0...10) == .failure(.minusSign))
        #expect(DecimalNumber.integer("-2", in: -1...10) == .failure(.outOfRange))
        #expect(DecimalNumber.integer("-1", in: -1...10) == .success(-1))
        #expect(DecimalNumber.integer("100", in: 1...100) == .success(100))
    }

    @Test func unsignedTakesAll64Bits() {
        #expect(DecimalNumber.unsigned("18446744073709551615") == .success(.max))
        #expect(DecimalNumber.unsigned("18446744073709551616") == .failure(.outOfRange))
        #expect(DecimalNumber.unsigned("-1") == .failure(.minusSign))
        #expect(DecimalNumber.unsigned("-0") == .failure(.minusSign))
        #expect(DecimalNumber.unsigned("+1") == .failure(.plusSign))
        #expect(DecimalNumber.unsigned("5", max: 4) == .failure(.outOfRange))
    }

    @Test(arguments: [("0", 0.0), ("0.5", 0.5), ("30", 30.0), ("300", 300.0), ("0.000", 0.0), ("1.25", 1.25), ("299.999999999999999999", 300.0)])
    func secondsInTheGrammar(text: String, value: Double) {
        let r = DecimalNumber.decimal(text, in: 0...300)
        #expect(r == .success(value))
        if case let .success(v) = r { #expect(v.sign == .plus) }
    }

    @Test(arguments: [
        ("0x1p4", DecimalNumber.Refusal.hexadecimal), ("inf", .notANumber), ("infinity", .notANumber), ("nan", .notANumber),
        ("+1", .plusSign), ("1e2", .exponent), ("1.5e2", .exponent), (".5", .missingDigits), ("5.", .missingDigits),
        ("05", .leadingZero), ("1..5", .missingDigits), ("1,5", .unexpected(UInt8(ascii: ","))), ("300.5", .outOfRange),
        ("-1", .minusSign), ("-0", .minusSign), ("-0.0", .minusSign), ("1" + String(repeating: "0", count: 400), .outOfRange),
    ])
    func secondsRefused(text: String, refusal: DecimalNumber.Refusal) {
        #expect(DecimalNumber.decimal(text, in: 0...300) == .failure(refusal))
    }

    @Test func refusalsSayWhatWasWrong() {
        #expect(DecimalNumber.Refusal.hexadecimal.description == "hexadecimal is not allowed")
        #expect(DecimalNumber.Refusal.unexpected(UInt8(ascii: "_")).description == "'_' is not allowed")
        #expect(DecimalNumber.Refusal.unexpected(0xD9).description == "byte 0xD9 is not allowed")
        #expect(DecimalNumber.Refusal.unexpected(0).description == "byte 0x00 is not allowed")
    }
}

@Suite struct RFC3339Tests {
    static let base: Int64 = 1_795_341_600 * 1_000_000_000  // 2026-11-22T10:00:00Z
    static let acceptedTimes: [(String, Int64)] = [
        ("1970-01-01T00:00:00Z", 0),
        ("2026-11-22T10:00:00Z", base),
        ("2026-11-22T10:00:00.125Z", base + 125_000_000),
        ("2026-11-22t10:00:00z", base),
        ("2026-11-22T11:30:00+01:30", base),
        ("2026-11-22T08:00:00-02:00", base),
        ("2026-11-22T10:00:00-00:00", base),
        ("2024-02-29T00:00:00Z", 1_709_164_800 * 1_000_000_000),
        ("2000-02-29T00:00:00Z", 951_782_400 * 1_000_000_000),
        ("2026-11-22T10:00:00.123456789999Z", base + 123_456_789),
        ("2261-12-31T23:59:59.999999999Z", 9_214_646_399 * 1_000_000_000 + 999_999_999),
        // In the years 1970 to 2261 both as written and in UTC.
        ("1970-01-01T23:59:00+23:59", 0),
        ("2261-12-31T00:00:59.999999999-23:59", 9_214_646_399 * 1_000_000_000 + 999_999_999),
    ]

    @Test(arguments: acceptedTimes)
    func accepted(text: String, nanoseconds: Int64) {
        #expect(RFC3339.nanoseconds(text) == .success(nanoseconds))
    }

    @Test(arguments: [
        "2026-02-30T00:00:00Z", "2026-04-31T00:00:00Z", "2026-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2100-02-29T00:00:00Z",
        "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-32T00:00:00Z",
        "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z", "2026-01-01T00:00:60Z", "2026-01-01T00:00:61Z",
    ])
    func noSuchTime(text: String) {
        guard case let .failure(r) = RFC3339.nanoseconds(text) else { Issue.record("accepted \(text)"); return }
        switch r {
        case .month, .day, .hour, .minute, .second: break
        default: Issue.record("\(text): refused as \(r), not as a time that does not exist")
        }
    }

    @Test(arguments: [
        "2026-11-22T10:00:00+24:00", "2026-11-22T10:00:00-24:00", "2026-11-22T10:00:00+23:60", "2026-11-22T10:00:00+5:00",
        "2026-11-22T10:00:00+0500", "2026-11-22T10:00:00+05", "2026-11-22 10:00:00Z", "2026-11-22T10:00:00",
        "2026-11-22T10:00Z", "2026-11-22", "26-11-22T10:00:00Z", "+2026-11-22T10:00:00Z", "2026-11-22T10:00:00.Z",
        "2026-11-22T10:00:00,5Z", "2026-11-22T10:00:00Z ", " 2026-11-22T10:00:00Z", "2026-11-22T10:00:00ZZ",
        "２０２６-11-22T10:00:00Z", "2026-1-22T10:00:00Z", "", "now", "1795341600",
    ])
    func malformed(text: String) {
        guard case let .failure(r) = RFC3339.nanoseconds(text) else { Issue.record("accepted \(text)"); return }
        switch r {
        case .syntax, .offset: break
        default: Issue.record("\(text): refused as \(r), not as malformed")
        }
    }

    @Test(arguments: [
        "1969-12-31T23:59:59.999Z", "1969-12-31T23:30:00-00:30", "0001-01-01T00:00:00Z", "0000-01-01T00:00:00Z",
        "1900-01-01T00:00:00Z", "2262-01-01T00:00:00Z", "2262-01-01T00:30:00+01:00", "2300-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
    ])
    func outsideTheYears(text: String) {
        #expect(RFC3339.nanoseconds(text) == .failure(.outOfRange))
    }

    @Test(arguments: ["1970-01-01T00:30:00+01:00", "1970-01-01T00:00:00+00:01", "2261-12-31T23:00:00-01:00", "2261-12-31T12:00:00-12:00"])
    func offsetTakesItOutsideTheYears(text: String) {
        // Accepted, it would be written back (UTC) as 1969 or 2262, which could not be read again.
        #expect(RFC3339.nanoseconds(text) == .failure(.outOfRangeInUTC))
    }

    @Test func refusalsNameTheProblem() {
        #expect(RFC3339.Refusal.day(year: 2026, month: 2, day: 30, daysInMonth: 28).description == "February 2026 has 28 days, so there is no day 30")
        #expect(RFC3339.Refusal.second(60).description.contains("leap second"))
        #expect(RFC3339.Refusal.outOfRange.description == "it is outside the years 1970 to 2261")
    }
}

/// openapi.yaml's patterns for these grammars (`NotBefore`, `Seconds300`, `Seconds3600`,
/// `Last-Event-ID`) must accept exactly what the parsers accept: schemathesis generates
/// "valid" and "invalid" values from them, and a client may validate with them.
@Suite struct OpenAPIPatternTests {
    static let document: String = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return (try? String(contentsOf: root.appendingPathComponent("openapi.yaml"), encoding: .utf8)) ?? ""
    }()

    /// The `pattern:` of the first schema or parameter after `anchor`.
    static func pattern(after anchor: String) throws -> NSRegularExpression {
        let text = try #require(document.range(of: anchor).map { document[$0.upperBound...] }, "openapi.yaml has \(anchor)")
        let line = try #require(text.split(separator: "\n").first { $0.trimmingCharacters(in: .whitespaces).hasPrefix("pattern: '") })
        let body = line.trimmingCharacters(in: .whitespaces).dropFirst("pattern: '".count).dropLast()
        return try NSRegularExpression(pattern: String(body))
    }

    static func matches(_ re: NSRegularExpression, _ s: String) -> Bool {
        re.firstMatch(in: s, range: NSRange(s.startIndex..., in: s)) != nil
    }

    @Test func notBeforeMatchesTheDateParser() throws {
        let re = try Self.pattern(after: "\n    NotBefore:\n")
        var texts: [String] = []
        for year in Array(1965...1975) + Array(1995...2005) + Array(2095...2105) + Array(2195...2205) + Array(2255...2265) {
            for month in 0...13 {
                for day in 0...32 { texts.append(String(format: "%04d-%02d-%02dT12:00:00Z", year, month, day)) }
            }
        }
        for time in ["00:00:00", "23:59:59", "24:00:00", "23:60:00", "23:59:60", "9:00:00", "12:00"] {
            for zone in ["Z", "z", "+00:00", "-00:00", "+23:59", "-23:59", "+24:00", "+05:60", "+0500", "", "+5:00", "Z "] {
                for fraction in ["", ".5", ".123456789123", "."] {
                    texts.append("2026-11-22T\(time)\(fraction)\(zone)")
                    texts.append("1970-01-01t\(time)\(fraction)\(zone)")
                    texts.append("2261-12-31T\(time)\(fraction)\(zone)")
                }
            }
        }
        texts += ["2026-11-22 10:00:00Z", "２０２６-11-22T10:00:00Z", "", "2026-11-22", "+2026-11-22T10:00:00Z", "2026-11-22T10:00:00ZZ"]
        var disagreements: [String] = []
        var accepted = 0
        var offsetRefusals = 0
        for text in texts {
            let result = RFC3339.nanoseconds(text)
            let parsed: Bool
            if case .success = result { parsed = true } else { parsed = false }
            if parsed { accepted += 1 }
            // The one refusal a pattern cannot express: an offset that takes a time written in
            // 1970 or 2261 outside those years in UTC (the pattern admits it; openapi.yaml says so).
            if result == .failure(.outOfRangeInUTC) {
                offsetRefusals += 1
                if !Self.matches(re, text) { disagreements.append(text) }
                continue
            }
            if parsed != Self.matches(re, text) { disagreements.append(text) }
        }
        #expect(disagreements.isEmpty, "openapi.yaml's NotBefore pattern and the parser disagree on \(disagreements.prefix(20))")
        #expect(offsetRefusals > 0)
        #expect(texts.count > 25_000 && accepted > 10_000 && accepted < texts.count - 5_000, "\(accepted) of \(texts.count) accepted")
    }

    @Test(arguments: [("Seconds300", 300.0), ("Seconds3600", 3600.0)])
    func secondsMatchTheNumberParser(schema: String, maximum: Double) throws {
        let re = try Self.pattern(after: "\n    \(schema):\n")
        var texts = [
            "0", "00", "0.0", "0.5", ".5", "5.", "1", "01", "1e2", "0x10", "inf", "nan", "-0", "-1", "+1", " 1", "1 ", "",
            "299.9999999999999999999", "300", "300.0", "300.000000000000000001", "300.5", "301", "3599.99", "3600", "3600.00",
            "3600.0000001", "3601", "9999", "10000", "99999999999999999999", "1,5", "1_0",
        ]
        var generator = SplitMix(state: 42)
        for _ in 0..<3000 {
            let whole = generator.below(4200)
            let fraction = generator.below(3) == 0 ? "" : "." + String(generator.below(1000))
            texts.append("\(whole)\(fraction)")
        }
        var disagreements: [String] = []
        for text in texts {
            let parsed: Bool
            if case .success = DecimalNumber.decimal(text, in: 0...maximum) { parsed = true } else { parsed = false }
            if parsed != Self.matches(re, text) { disagreements.append(text) }
        }
        #expect(disagreements.isEmpty, "openapi.yaml's \(schema) pattern and the parser disagree on \(disagreements.prefix(20))")
    }

    @Test func lastEventIDMatchesTheNumberParser() throws {
        let re = try Self.pattern(after: "- name: Last-Event-ID")
        var texts = [
            "", "0", "00", "1", "-1", "+1", "1.0", "1e3", "0x1", "18446744073709551615", "18446744073709551616", "18446744073709551614",
            "99999999999999999999", "9223372036854775807", "184467440737095516150",
        ]
        var generator = SplitMix(state: 7)
        for _ in 0..<3000 {
            let digits = 1 + generator.below(20)
            texts.append(String((0..<digits).map { _ in Character(String(generator.below(10))) }))
        }
        var disagreements: [String] = []
        for text in texts {
            var parsed = text.isEmpty  // an empty Last-Event-ID is no id, not a refusal
            if case .success = DecimalNumber.integer(text, in: 0...Int.max) { parsed = true }
            if parsed != Self.matches(re, text) { disagreements.append(text) }
        }
        #expect(disagreements.isEmpty, "openapi.yaml's Last-Event-ID pattern and the parser disagree on \(disagreements.prefix(20))")
    }
}

/// A small deterministic generator (SplitMix64).
struct SplitMix {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
