import Foundation
import QueueEngine
import TestKit
import Testing

/// The hand-written JSON codec (`JSONValue`, `JSONWriter`) and RFC 3339 code (`Timestamp`)
/// checked against Foundation's `JSONSerialization` and `ISO8601DateFormatter` on generated and
/// edge-case inputs: what one writes the other reads back to the same value.
@Suite struct CodecTests {
    // MARK: - generated values

    /// Generated JSON values from a seed (TestKit's SplitMix64), so a failure names a reproducible seed.
    struct Generator {
        var random: SplitMix64
        /// U+FEFF in strings. swift-corelibs-foundation's JSONSerialization drops it from the
        /// strings it parses (seen here: "\u{FEFF}a" came back "a"), so comparisons with
        /// Foundation leave it out; our own round trip keeps it.
        var byteOrderMarks = false

        init(state: UInt64, byteOrderMarks: Bool = false) {
            random = SplitMix64(seed: state)
            self.byteOrderMarks = byteOrderMarks
        }
        mutating func next() -> UInt64 { random.next() }
        mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }

        /// Characters JSON must escape, ASCII, two-, three- and four-byte UTF-8, combining marks.
        mutating func string() -> String {
            let pool: [Unicode.Scalar] =
                [
                    "\"", "\\", "/", "\n", "\r", "\t", "\u{0}", "\u{1}", "\u{1F}", "\u{7F}", "a", "Z", " ",
                    "é", "ß", "\u{301}", "€", "中", "\u{FFFD}", "😀", "\u{10FFFF}", "\u{2028}",
                ]
                + (byteOrderMarks ? ["\u{FEFF}"] : [])
            var s = String.UnicodeScalarView()
            for _ in 0..<below(12) { s.append(pool[below(pool.count)]) }
            return String(s)
        }

        mutating func number() -> Double {
            switch below(4) {
            case 0: return Double(Int64(bitPattern: next()) >> Int64(below(64)))  // integers, some beyond 2^53
            case 1: return Double(below(2_000_001) - 1_000_000) / 1000
            case 2: return Double(bitPattern: next() & 0x7FEF_FFFF_FFFF_FFFF) * (below(2) == 0 ? 1 : -1)  // any finite
            default: return [0, -0.0, 1e-7, 5e-324, 1.7976931348623157e308, 0.1, 1e15, 1e16, 123456789.125][below(9)]
            }
        }

        mutating func value(depth: Int = 0) -> JSONValue {
            switch below(depth > 3 ? 4 : 6) {
            case 0: return .null
            case 1: return .bool(below(2) == 0)
            case 2: return .number(number())
            case 3: return .string(string())
            case 4: return .array((0..<below(5)).map { _ in value(depth: depth + 1) })
            default:
                var members: [(String, JSONValue)] = []
                for i in 0..<below(5) { members.append((string() + "#\(i)", value(depth: depth + 1))) }  // unique keys
                return .object(members)
            }
        }
    }

    /// `value` as Foundation's JSON objects.
    static func foundation(_ value: JSONValue) -> Any {
        switch value {
        case .null: return NSNull()
        case let .bool(b): return b
        case let .number(n): return n
        case let .string(s): return s
        case let .array(items): return items.map(foundation)
        case let .object(members): return Dictionary(members.map { ($0.0, foundation($0.1)) }, uniquingKeysWith: { a, _ in a })
        }
    }

    /// Whether Foundation's parse result `any` is `value`.
    static func matches(_ value: JSONValue, _ any: Any) -> Bool {
        switch value {
        case .null: return any is NSNull
        case let .bool(b): return (any as? Bool) == b
        case let .number(n):
            // swift-corelibs-foundation parses 17-digit numbers and large exponents inexactly
            // (seen: 1000000000000000.5 read as 1000000000000000.4, 1.1865126918751309e-85 off
            // further): a relative 1e-12. Our own parser is checked exact (ourOwnRoundTripIsExact).
            guard let d = (any as? NSNumber)?.doubleValue else { return false }
            return d == n || abs(d - n) <= 1e-12 * abs(n)
        case let .string(s): return (any as? String) == s
        case let .array(items):
            guard let list = any as? [Any], list.count == items.count else { return false }
            return zip(items, list).allSatisfy { matches($0, $1) }
        case let .object(members):
            guard let dictionary = any as? [String: Any], dictionary.count == members.count else { return false }
            return members.allSatisfy { key, member in dictionary[key].map { matches(member, $0) } ?? false }
        }
    }

    @Test(arguments: 0..<8)
    func foundationReadsWhatWeWrite(seed: UInt64) throws {
        var generator = Generator(state: seed)
        for _ in 0..<200 {
            let value = generator.value()
            let parsed = try JSONSerialization.jsonObject(with: Data(value.bytes), options: [.fragmentsAllowed])
            #expect(Self.matches(value, parsed), "seed \(seed): \(value.text)")
        }
    }

    @Test(arguments: 0..<8)
    func weReadWhatFoundationWrites(seed: UInt64) throws {
        var generator = Generator(state: seed)
        for _ in 0..<200 {
            let value = generator.value()
            let data = try JSONSerialization.data(withJSONObject: Self.foundation(value), options: [.fragmentsAllowed])
            let parsed = try JSONValue.parse(Array(data))
            // Foundation's dictionaries do not keep member order: compare member by member.
            #expect(Self.matches(parsed, Self.foundation(value)), "seed \(seed): \(String(decoding: data, as: UTF8.self))")
        }
    }

    @Test(arguments: 0..<4)
    func ourOwnRoundTripIsExact(seed: UInt64) throws {
        var generator = Generator(state: seed, byteOrderMarks: true)
        for _ in 0..<500 {
            let value = generator.value()
            #expect(try JSONValue.parse(value.bytes) == value)
        }
    }

    // MARK: - edge cases

    @Test func escapesAndUnicodeMatchFoundation() throws {
        let documents = [
            #""\ud83d\ude00""#, #""\u00e9\u0000\u001f""#, #""\/\b\f\n\r\t\"\\""#, "\"é中😀\"", #""\uFEFF\u2028""#,
            #"{"a":[1,{"b":null}],"c":"\u0041"}"#, " [ true , false , null ] ", #""""#, "[]", "{}",
        ]
        for document in documents {
            let ours = try JSONValue.parse(document)
            let theirs = try JSONSerialization.jsonObject(with: Data(document.utf8), options: [.fragmentsAllowed])
            #expect(Self.matches(ours, theirs), "\(document)")
        }
    }

    @Test func numbersMatchFoundation() throws {
        for text in [
            "0", "-0", "1", "-1", "1e308", "1E+2", "2.5e-3", "0.1", "123456789012345678", "9007199254740993",
            "-1.7976931348623157e308", "5e-324", "1.0", "100000000000000000000",
        ] {
            guard case let .number(ours) = try JSONValue.parse(text) else {
                Issue.record("\(text) is not a number to us")
                continue
            }
            let theirs = try JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])
            #expect(Self.matches(.number(ours), theirs), "\(text)")
            #expect(ours == Double(text), "\(text): Swift's own Double(String) is exact")
        }
        // What we write for a number is read back by Foundation as the same Double.
        for n in [0.1, 1e15, 1e15 + 0.5, 1e16, -2.5e-8, 123456789.125, 4503599627370497] {
            var out: [UInt8] = []
            JSONWriter.number(n, to: &out)
            let back = try JSONSerialization.jsonObject(with: Data(out), options: [.fragmentsAllowed])
            #expect(Self.matches(.number(n), back), "\(String(decoding: out, as: UTF8.self))")
            // Our own parser reads it back exactly.
            #expect(try JSONValue.parse(out) == .number(n))
        }
    }

    @Test func malformedDocumentsAreRefusedByBoth() {
        // Foundation accepts a trailing comma; RFC 8259 does not, and neither do we.
        for document in ["[1,]", #"{"a":1,}"#] {
            #expect(throws: JSONParseError.self, "\(document)") { try JSONValue.parse(document) }
            #expect(
                (try? JSONSerialization.jsonObject(with: Data(document.utf8), options: [.fragmentsAllowed])) != nil,
                "Foundation now refuses \(document) too: move it to the list below")
        }
        for document in [
            "", "[1 2]", "{a:1}", "1.", ".5", "+1", "NaN", "tru", "1e", "-", "[",
            #""\x""#, "\"\u{01}\"", #""abc"#, "{\"a\"}", "[1]]",
        ] {
            #expect(throws: JSONParseError.self, "\(document.debugDescription)") { try JSONValue.parse(document) }
            #expect(
                (try? JSONSerialization.jsonObject(with: Data(document.utf8), options: [.fragmentsAllowed])) == nil,
                "Foundation accepts \(document.debugDescription)")
        }
    }

    @Test func writerEscapesWhatFoundationNeeds() throws {
        var generator = Generator(state: 99)
        for _ in 0..<500 {
            let s = generator.string()
            var out: [UInt8] = []
            JSONWriter.string(s, to: &out)
            let back = try JSONSerialization.jsonObject(with: Data(out), options: [.fragmentsAllowed]) as? String
            #expect(back == s, "\(s.debugDescription) written as \(String(decoding: out, as: UTF8.self))")
        }
    }

    // MARK: - RFC 3339

    static func formatter(fractional: Bool) -> ISO8601DateFormatter {
        let f = ISO8601DateFormatter()
        f.formatOptions = fractional ? [.withInternetDateTime, .withFractionalSeconds] : [.withInternetDateTime]
        return f
    }

    @Test(arguments: 0..<4)
    func formattingMatchesFoundation(seed: UInt64) {
        let whole = Self.formatter(fractional: false), fractional = Self.formatter(fractional: true)
        var generator = Generator(state: seed)
        // 1678-2261: the years Int64 nanoseconds cover.
        let span: UInt64 = 9_200_000_000_000
        for _ in 0..<500 {
            let ms = Int64(generator.next() % (2 * span)) - Int64(span)
            let ours = Timestamp(nanoseconds: ms * 1_000_000).rfc3339
            if ms % 1000 == 0 {
                // Whole seconds: no floating point in Date, the strings must be identical.
                let date = Date(timeIntervalSince1970: Double(ms / 1000))
                #expect(ours == whole.string(from: date).replacingOccurrences(of: "Z", with: ".000Z"), "\(ms) ms")
            }
            // Foundation reads ours back to the same instant (within its Double's precision).
            guard let back = fractional.date(from: ours) else {
                Issue.record("Foundation cannot read \(ours)")
                continue
            }
            #expect(abs(back.timeIntervalSince1970 * 1000 - Double(ms)) < 0.5, "\(ours)")
        }
    }

    @Test func parsingMatchesFoundation() throws {
        let fractional = Self.formatter(fractional: true), whole = Self.formatter(fractional: false)
        var texts = [
            "1970-01-01T00:00:00Z", "2000-02-29T23:59:59.999Z", "2024-02-29T12:00:00+05:30", "1970-01-01T00:00:00.001+00:00",
            "2100-12-31T23:59:59.5-00:30", "2026-11-22T10:00:00.125Z", "2261-12-31T23:59:59.999Z", "2261-01-01T00:00:00Z",
        ]
        var generator = Generator(state: 7)
        for _ in 0..<300 {
            let (y, mo) = (1971 + generator.below(290), 1 + generator.below(12))  // the accepted years, 1970-2261, less an offset's reach
            let days = [31, (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)) ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][mo - 1]
            let offset =
                generator.below(3) == 0
                ? "Z"
                : String(
                    format: "%@%02d:%02d", generator.below(2) == 0 ? "+" : "-",
                    generator.below(15), [0, 30, 45][generator.below(3)])
            let fraction = generator.below(2) == 0 ? "" : String(format: ".%03d", generator.below(1000))
            texts.append(
                String(
                    format: "%04d-%02d-%02dT%02d:%02d:%02d", y, mo, 1 + generator.below(days), generator.below(24),
                    generator.below(60), generator.below(60)) + fraction + offset)
        }
        for text in texts {
            let ours = try #require(Timestamp(rfc3339: text), "\(text)")
            let theirs = fractional.date(from: text) ?? whole.date(from: text)
            let date = try #require(theirs, "Foundation cannot read \(text)")
            #expect(abs(date.timeIntervalSince1970 - ours.seconds) < 0.0005, "\(text)")
        }
    }

    @Test func lowercaseSeparatorsAreRFC3339() {
        // RFC 3339 5.6 allows "t" and "z"; Foundation's formatter refuses them, we read them.
        #expect(Timestamp(rfc3339: "2026-01-01t10:00:00z") == Timestamp(rfc3339: "2026-01-01T10:00:00Z"))
        #expect(Self.formatter(fractional: false).date(from: "2026-01-01t10:00:00z") == nil)
    }

    @Test func nineFractionDigitsKeepNanoseconds() {
        #expect(Timestamp(rfc3339: "1970-01-01T00:00:01.123456789Z")?.nanoseconds == 1_123_456_789)
        #expect(Timestamp(rfc3339: "1970-01-01T00:00:00.1234567891Z")?.nanoseconds == 123_456_789)
        #expect(Timestamp(nanoseconds: 1_999_999_999).rfc3339 == "1970-01-01T00:00:01.999Z")
        #expect(Timestamp(nanoseconds: -1).rfc3339 == "1969-12-31T23:59:59.999Z")
    }

    @Test func malformedTimesAreRefusedByBoth() {
        let f = Self.formatter(fractional: false)
        for text in [
            "2026-13-01T00:00:00Z", "2026-00-10T00:00:00Z", "2026-01-01T00:60:00Z",
            "2026-01-01T00:00:00", "2026-01-01 T00:00:00Z", "2026-01-01T00:00:00.Z",
        ] {
            #expect(Timestamp(rfc3339: text) == nil, "\(text)")
            #expect(f.date(from: text) == nil, "Foundation accepts \(text)")
        }
        // Foundation is lenient with these (hour 24, offset without colon or of 24 h, a
        // one-digit month); RFC 3339's grammar is not, and neither are we.
        for text in ["2026-01-01T24:00:00Z", "2026-01-01T00:00:00+0530", "2026-1-01T00:00:00Z", "2026-01-01T00:00:00+24:00"] {
            #expect(Timestamp(rfc3339: text) == nil, "\(text)")
            #expect(f.date(from: text) != nil, "Foundation now refuses \(text) too: move it to the list above")
        }
    }

    @Test func daysBeyondTheMonthAreRefusedWhereFoundationRollsOver() throws {
        // Foundation's formatter reads February 30th or April 31st as a day of the next month;
        // a client who wrote one made a mistake, and opqd refuses it (Grammar's RFC3339).
        let f = Self.formatter(fractional: false)
        for text in ["2023-02-29T00:00:00Z", "2024-02-30T00:00:00Z", "2100-02-29T00:00:00Z", "2026-04-31T00:00:00Z"] {
            #expect(f.date(from: text) != nil, "Foundation now refuses \(text) too")
            #expect(Timestamp(rfc3339: text) == nil, "\(text)")
        }
        #expect(Timestamp(rfc3339: "2024-02-29T00:00:00Z")?.seconds == f.date(from: "2024-02-29T00:00:00Z")?.timeIntervalSince1970)
    }

    @Test func yearsOutside1970To2261AreRefused() {
        #expect(Timestamp(rfc3339: "1969-12-31T23:59:59Z") == nil)
        #expect(Timestamp(rfc3339: "2262-01-01T00:00:00Z") == nil)
        // Both as written and in UTC: an accepted time is written back in a form read again.
        #expect(Timestamp(rfc3339: "1970-01-01T00:30:00+01:00") == nil)
        #expect(Timestamp(rfc3339: "1970-01-01T01:30:00+01:00")?.rfc3339 == "1970-01-01T00:30:00.000Z")
        #expect(Timestamp(rfc3339: "1970-01-01T00:00:00Z")?.nanoseconds == 0)
        #expect(Timestamp(rfc3339: "2261-12-31T23:59:59.999Z") != nil)
    }
}
