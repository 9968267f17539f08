/// The one grammar for a number a client writes as text (a query parameter such as `wait`,
/// `timeout`, `limit`, `after`, `max`; the `Last-Event-ID` header; a command-line flag).
///
/// Swift's `Int(_:)` and `Double(_:)` accept forms no client means: `+5`, `0x10`, `0x1p4`,
/// `inf`, `nan`, `1e3`, `_`-free but sign-laden strings, and `Double` rounds `1e400` to
/// infinity. This parser takes JSON's number grammar without the exponent, and nothing else:
///
///     integer = [ "-" ] ( "0" / %x31-39 *DIGIT )                 ; no fraction, no exponent
///     decimal = [ "-" ] ( "0" / %x31-39 *DIGIT ) [ "." 1*DIGIT ]  ; seconds
///
/// No `+`, no leading zeros (`010` is 10 to one client and 8 to another), no whitespace, no
/// `.5` or `5.`, no exponent, no hexadecimal, no `inf`/`nan`, and no `-` where the range has
/// no negative value (every query number: so `-0` is refused there too). The range is checked
/// after the grammar. Every refusal says what was wrong, for a problem detail that names the
/// parameter.
public enum DecimalNumber {
    /// Why a text is not a number of the grammar, or not in range.
    public enum Refusal: Error, Equatable, Sendable, CustomStringConvertible {
        case empty
        case plusSign
        case minusSign  // where no value is negative
        case leadingZero
        case hexadecimal
        case exponent
        case fraction  // an integer parameter given a fraction
        case notANumber  // inf, infinity, nan
        case whitespace
        case missingDigits  // "-", "1.", ".5"
        case unexpected(UInt8)
        case outOfRange

        public var description: String {
            switch self {
            case .empty: return "it is empty"
            case .plusSign: return "a leading '+' is not allowed"
            case .minusSign: return "a '-' is not allowed: the value cannot be negative"
            case .leadingZero: return "leading zeros (as in 05) are not allowed"
            case .hexadecimal: return "hexadecimal is not allowed"
            case .exponent: return "an exponent is not allowed"
            case .fraction: return "a fraction is not allowed"
            case .notANumber: return "infinity and NaN are not numbers here"
            case .whitespace: return "whitespace is not allowed"
            case .missingDigits: return "digits are missing"
            case let .unexpected(byte):
                if byte >= 0x21 && byte < 0x7F { return "'\(Character(Unicode.Scalar(byte)))' is not allowed" }
                return "byte 0x\(byte < 16 ? "0" : "")\(String(byte, radix: 16, uppercase: true)) is not allowed"
            case .outOfRange: return "it is out of range"
            }
        }

        /// `must be WHAT, written as RULE; got 'TEXT'`, then `: WHY` unless the number was only
        /// out of range (WHAT names the range): the one wording of a refused number, after the
        /// parameter or flag it is about.
        public func explained(must what: String, writtenAs rule: String, got text: String) -> String {
            "must be \(what), written as \(rule); got '\(text)'\(self == .outOfRange ? "" : ": \(self)")"
        }
    }

    /// The grammar in words, for problem details and openapi.yaml.
    public static let integerRule = "plain decimal digits (no sign, no leading zeros as in 05, no fraction, exponent or hexadecimal)"
    public static let decimalRule =
        "plain decimal digits with an optional fraction like 2.5 (no sign, no leading zeros as in 05, no exponent, hexadecimal, inf or nan)"

    /// An integer in `range`.
    public static func integer(_ text: some StringProtocol, in range: ClosedRange<Int>) -> Result<Int, Refusal> {
        switch scan(Array(text.utf8), fraction: false) {
        case let .failure(r): return .failure(r)
        case let .success(s):
            if s.negative && range.lowerBound >= 0 { return .failure(.minusSign) }
            guard let magnitude = s.magnitude else { return .failure(.outOfRange) }
            let value: Int
            if s.negative {
                // -Int.min's magnitude is Int.max + 1.
                guard magnitude <= UInt64(Int.max) + 1 else { return .failure(.outOfRange) }
                value = magnitude == UInt64(Int.max) + 1 ? Int.min : -Int(magnitude)
            } else {
                guard magnitude <= UInt64(Int.max) else { return .failure(.outOfRange) }
                value = Int(magnitude)
            }
            return range.contains(value) ? .success(value) : .failure(.outOfRange)
        }
    }

    /// An unsigned integer up to `max` (a sequence number may use all 64 bits).
    public static func unsigned(_ text: some StringProtocol, max: UInt64 = .max) -> Result<UInt64, Refusal> {
        switch scan(Array(text.utf8), fraction: false) {
        case let .failure(r): return .failure(r)
        case let .success(s):
            if s.negative { return .failure(.minusSign) }
            guard let magnitude = s.magnitude, magnitude <= max else { return .failure(.outOfRange) }
            return .success(magnitude)
        }
    }

    /// A decimal (seconds) in `range`.
    public static func decimal(_ text: some StringProtocol, in range: ClosedRange<Double>) -> Result<Double, Refusal> {
        let bytes = Array(text.utf8)
        switch scan(bytes, fraction: true) {
        case let .failure(r): return .failure(r)
        case let .success(s):
            if s.negative && range.lowerBound >= 0 { return .failure(.minusSign) }
            // The text is now plain decimal, which `Double(_:)` reads with correct rounding and
            // cannot misread; a value past Double's range becomes infinity, refused below.
            guard let v = Double(String(decoding: bytes, as: UTF8.self)), v.isFinite, range.contains(v) else { return .failure(.outOfRange) }
            // Rounding must not carry a value over a whole bound: 300.00000000000000001 reads as
            // 300.0 but is more than 300, 0.99999999999999999999 reads as 1.0 but is less than 1.
            // A fractional bound (0.01) compares the correctly rounded value.
            if !s.isAtMost(range.upperBound) || !s.isAtLeast(range.lowerBound) { return .failure(.outOfRange) }
            return .success(v == 0 ? 0 : v)  // -0 is 0
        }
    }

    /// A scanned number: its sign, and its integer part's magnitude (nil past UInt64).
    struct Scanned {
        var negative: Bool
        var magnitude: UInt64?
        /// Whether a fraction has a digit other than 0.
        var fractionIsNonZero = false

        /// Whether the exact value is at most `bound`, when the bound is a whole number under
        /// 10^18 in size (true otherwise: the rounded value was compared already). The value is
        /// ±(whole + f) with 0 <= f < 1, f > 0 exactly when `fractionIsNonZero`.
        func isAtMost(_ bound: Double) -> Bool {
            guard let whole = magnitude, let b = Self.whole(bound) else { return true }
            if !negative { return b >= 0 && (whole < UInt64(b) || (whole == UInt64(b) && !fractionIsNonZero)) }
            return b >= 0 || whole >= b.magnitude
        }

        /// Whether the exact value is at least `bound` (see ``isAtMost(_:)``).
        func isAtLeast(_ bound: Double) -> Bool {
            guard let whole = magnitude, let b = Self.whole(bound) else { return true }
            if !negative { return b <= 0 || whole >= UInt64(b) }
            if whole == 0 && !fractionIsNonZero { return b <= 0 }  // -0 is 0
            return b < 0 && (whole < b.magnitude || (whole == b.magnitude && !fractionIsNonZero))
        }

        /// A bound that is a whole number of less than 10^18 in size, as an Int64.
        static func whole(_ bound: Double) -> Int64? {
            guard bound.magnitude < 1e18, bound == bound.rounded() else { return nil }
            return Int64(bound)
        }
    }

    static func scan(_ b: [UInt8], fraction allowFraction: Bool) -> Result<Scanned, Refusal> {
        guard !b.isEmpty else { return .failure(.empty) }
        var i = 0
        var negative = false
        if b[0] == UInt8(ascii: "+") { return .failure(.plusSign) }
        if b[0] == UInt8(ascii: "-") {
            negative = true
            i = 1
        }
        // The forms Swift's parsers accept and people may try, named before the generic refusal.
        let rest = b[i...].map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 | 0x20 : $0 }  // ASCII lowercase
        if rest.starts(with: Array("inf".utf8)) || rest.starts(with: Array("nan".utf8)) { return .failure(.notANumber) }
        if rest.count >= 2, rest[rest.startIndex] == UInt8(ascii: "0"), rest[rest.startIndex + 1] == UInt8(ascii: "x") { return .failure(.hexadecimal) }
        guard i < b.count else { return .failure(.missingDigits) }
        guard isDigit(b[i]) else { return .failure(refusal(b[i])) }
        if b[i] == UInt8(ascii: "0"), i + 1 < b.count, isDigit(b[i + 1]) { return .failure(.leadingZero) }
        var magnitude: UInt64? = 0
        var nonZeroFraction = false
        while i < b.count, isDigit(b[i]) {
            if let m = magnitude {
                let (times10, o1) = m.multipliedReportingOverflow(by: 10)
                let (sum, o2) = times10.addingReportingOverflow(UInt64(b[i] &- UInt8(ascii: "0")))
                magnitude = o1 || o2 ? nil : sum
            }
            i += 1
        }
        if i < b.count, b[i] == UInt8(ascii: ".") {
            guard allowFraction else { return .failure(.fraction) }
            i += 1
            guard i < b.count, isDigit(b[i]) else { return .failure(i < b.count ? refusal(b[i]) : .missingDigits) }
            while i < b.count, isDigit(b[i]) {
                if b[i] != UInt8(ascii: "0") { nonZeroFraction = true }
                i += 1
            }
        }
        guard i == b.count else { return .failure(refusal(b[i])) }
        return .success(Scanned(negative: negative, magnitude: magnitude, fractionIsNonZero: nonZeroFraction))
    }

    static func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    static func refusal(_ c: UInt8) -> Refusal {
        switch c {
        case UInt8(ascii: "e"), UInt8(ascii: "E"): return .exponent
        case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"), 0x0B, 0x0C: return .whitespace
        case UInt8(ascii: "+"): return .plusSign
        case UInt8(ascii: "."): return .missingDigits
        default: return .unexpected(c)
        }
    }
}
