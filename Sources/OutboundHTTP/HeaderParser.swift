/// Reads one header line of a response as libcurl hands it over (CRLF included). Total on
/// any bytes: invalid UTF-8 is decoded lossily (U+FFFD), nothing traps.
public enum HeaderLine: Sendable, Equatable {
    /// A status line `HTTP/x yyy reason` (also of 1xx interim responses): a new response begins.
    case status(Int?)
    /// A field `name: value`; the value without surrounding spaces and tabs.
    case field(name: String, value: String)
    /// A folded continuation line (starts with space or tab) to append to the previous value.
    case continuation(String)
    /// The empty line that ends a header block.
    case end
    /// A line that is none of these (no colon, empty name): ignored.
    case malformed

    /// Parses one line.
    public static func parse<C: Collection>(_ line: C) -> HeaderLine where C.Element == UInt8 {
        // libcurl's lines (and arrays) are contiguous: parsed in place, not copied first (this
        // runs for every header line of every response).
        if let parsed = line.withContiguousStorageIfAvailable(parse(contiguous:)) { return parsed }
        return Array(line).withUnsafeBufferPointer(parse(contiguous:))
    }

    private static func parse(contiguous line: UnsafeBufferPointer<UInt8>) -> HeaderLine {
        var end = line.count
        while end > 0, line[end - 1] == 0x0A || line[end - 1] == 0x0D { end -= 1 }
        let bytes = UnsafeBufferPointer(rebasing: line[..<end])
        if bytes.isEmpty { return .end }
        if bytes.starts(with: "HTTP/".utf8) {
            // "HTTP/1.1 200 OK": three digits after the first space.
            guard let space = bytes.firstIndex(of: 0x20) else { return .status(nil) }
            let digits = bytes[(space + 1)...].prefix(3)
            guard digits.count == 3, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return .status(nil) }
            return .status(digits.reduce(0) { $0 * 10 + Int($1 - 0x30) })
        }
        if bytes[0] == 0x20 || bytes[0] == 0x09 { return .continuation(trimmed(bytes[...])) }
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")), colon > 0 else { return .malformed }
        let name = String(decoding: bytes[..<colon], as: UTF8.self)
        return .field(name: name, value: trimmed(bytes[(colon + 1)...]))
    }

    static func trimmed(_ bytes: Slice<UnsafeBufferPointer<UInt8>>) -> String {
        var s = bytes.startIndex, e = bytes.endIndex
        while s < e, bytes[s] == 0x20 || bytes[s] == 0x09 { s += 1 }
        while e > s, bytes[e - 1] == 0x20 || bytes[e - 1] == 0x09 { e -= 1 }
        return String(decoding: bytes[s..<e], as: UTF8.self)
    }
}

/// The header block of one response, built line by line with a byte cap.
public struct HeaderBlock: Sendable {
    /// Status from the last status line, when it had three digits.
    public private(set) var status: Int?
    /// Fields in order received.
    public private(set) var fields: [(String, String)] = []
    /// Bytes of the current response's header block so far.
    public private(set) var bytes = 0
    /// Cap on ``bytes``.
    public let limit: Int

    /// An empty block that accepts `limit` bytes.
    public init(limit: Int) { self.limit = max(0, limit) }

    /// Adds one line; false when the block would exceed ``limit`` (the line is not added).
    public mutating func add<C: Collection>(_ line: C) -> Bool where C.Element == UInt8 {
        switch HeaderLine.parse(line) {
        case let .status(code):
            // A new response (after a 1xx): its headers replace the interim ones.
            status = code
            fields = []
            bytes = 0
        case let .field(name, value):
            fields.append((name, value))
        case let .continuation(more):
            if let last = fields.popLast() { fields.append((last.0, last.1.isEmpty ? more : last.1 + " " + more)) }
        case .end, .malformed:
            break
        }
        let (sum, overflow) = bytes.addingReportingOverflow(line.count)
        bytes = overflow ? Int.max : sum
        return bytes <= limit
    }

    /// The value of the first field named `name` (case-insensitive).
    public func value(_ name: String) -> String? {
        let lower = name.lowercased()
        return fields.first { $0.0.lowercased() == lower }?.1
    }
}
