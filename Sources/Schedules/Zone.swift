#if canImport(Glibc)
import Glibc
#endif

/// A time zone from the system's tz database (Debian `tzdata`, `/usr/share/zoneinfo`): its UTC
/// offsets over time, read from the TZif file (RFC 8536, version 2 or later: 64-bit
/// transitions, then the footer's POSIX TZ rule for every time after the last one).
///
/// Times are seconds since 1970 (UTC). A *local* time is the wall clock read as if it were
/// UTC (seconds since 1970-01-01T00:00 local).
public struct Zone: Sendable {
    public let name: String
    /// Transition instants, ascending, and the offset (seconds east of UTC) from each on.
    let transitions: [Int64]
    let offsets: [Int32]
    /// The offset before the first transition.
    let initial: Int32
    /// For times after the last transition.
    let rule: PosixRule?

    /// Where the database lives (`TZDIR` overrides it, as for the C library).
    public static var directory: String {
        if let d = getenv("TZDIR") { return String(cString: d) }
        return "/usr/share/zoneinfo"
    }

    /// An IANA name: 1 to 64 of `A-Z a-z 0-9 _ + - /`, no empty or dot-led component.
    public static func isName(_ s: String) -> Bool {
        let b = Array(s.utf8)
        guard (1...64).contains(b.count), b.first != UInt8(ascii: "/"), b.last != UInt8(ascii: "/") else { return false }
        for c in b {
            let ok = (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x5F || c == 0x2B || c == 0x2D || c == 0x2F
            if !ok { return false }
        }
        return !s.split(separator: "/", omittingEmptySubsequences: false).contains { $0.isEmpty || $0.hasPrefix(".") }
    }

    /// UTC, without a file.
    public static let utc = Zone(name: "UTC", transitions: [], offsets: [], initial: 0, rule: nil)

    /// Loads `name` from the database; nil when it is not a zone there (or not a valid file).
    public static func load(_ name: String) -> Zone? {
        if name == "UTC" { return .utc }
        guard isName(name), let bytes = readFile(directory + "/" + name) else { return nil }
        return parse(name: name, bytes)
    }

    /// The offset in force at `utc`.
    public func offset(at utc: Int64) -> Int32 {
        if let last = transitions.last, utc >= last, let rule { return rule.offset(at: utc) }
        guard let first = transitions.first, utc >= first else { return initial }
        var lo = 0, hi = transitions.count - 1
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            if transitions[mid] <= utc { lo = mid } else { hi = mid - 1 }
        }
        return offsets[lo]
    }

    /// The last change of offset at or before `utc` (nil when none is known).
    public func lastTransition(atOrBefore utc: Int64) -> Int64? {
        if let last = transitions.last, utc >= last, let rule {
            return rule.lastTransition(atOrBefore: utc) ?? last
        }
        guard let first = transitions.first, utc >= first else { return nil }
        var lo = 0, hi = transitions.count - 1
        while lo < hi {
            let mid = (lo + hi + 1) / 2
            if transitions[mid] <= utc { lo = mid } else { hi = mid - 1 }
        }
        return transitions[lo]
    }

    /// Where a local time falls: the instants that show it (one; two when the clocks went back
    /// over it, earlier first), or none when the clocks jumped over it, with the first instant
    /// after that gap.
    public enum Placement: Equatable, Sendable {
        case one(Int64)
        case repeated(Int64, Int64)
        case gap(after: Int64)
    }

    public func place(local: Int64) -> Placement {
        let before = offset(at: local &- 86_400 * 2)
        let after = offset(at: local &+ 86_400 * 2)
        var found: [Int64] = []
        for o in Set([before, after, offset(at: local &- Int64(before))]) {
            let utc = local &- Int64(o)
            if offset(at: utc) == o && !found.contains(utc) { found.append(utc) }
        }
        found.sort()
        if found.count >= 2 { return .repeated(found[0], found[found.count - 1]) }
        if let one = found.first { return .one(one) }
        // In a gap: read with the offset before it, the time is past the change.
        let past = local &- Int64(before)
        return .gap(after: lastTransition(atOrBefore: past) ?? past)
    }

    // MARK: - the file

    static func readFile(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while out.count <= 1 << 20 {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, 65_536) }
            if n <= 0 { break }
            out.append(contentsOf: buffer[0..<n])
        }
        return out.count > 1 << 20 ? nil : out
    }

    /// A TZif file (version 2 or later: the second, 64-bit part and the footer). Nil unless it is one.
    static func parse(name: String, _ b: [UInt8]) -> Zone? {
        var r = Reader(b)
        guard let v1 = r.header() else { return nil }
        // Skip the 32-bit part.
        guard r.skip(v1.timecnt * 5 + v1.typecnt * 6 + v1.charcnt + v1.leapcnt * 8 + v1.isstdcnt + v1.isutcnt) else { return nil }
        guard v1.version >= 2, let h = r.header() else { return nil }
        var times: [Int64] = []
        for _ in 0..<h.timecnt {
            guard let t = r.int64() else { return nil }
            times.append(t)
        }
        var indices: [Int] = []
        for _ in 0..<h.timecnt {
            guard let i = r.byte(), Int(i) < h.typecnt else { return nil }
            indices.append(Int(i))
        }
        var types: [(offset: Int32, dst: Bool)] = []
        for _ in 0..<h.typecnt {
            guard let o = r.int32(), let dst = r.byte(), r.byte() != nil, (-89_999...93_599).contains(o) else { return nil }
            types.append((o, dst != 0))
        }
        guard !types.isEmpty, r.skip(h.charcnt + h.leapcnt * 12 + h.isstdcnt + h.isutcnt) else { return nil }
        // Footer: "\n<POSIX TZ>\n".
        var rule: PosixRule?
        if r.byte() == 0x0A, let end = r.rest.firstIndex(of: 0x0A) {
            let text = String(decoding: r.rest[r.rest.startIndex..<end], as: UTF8.self)
            if !text.isEmpty { rule = PosixRule(text) }
        }
        // Ascending transitions only (a damaged file must not confuse the search).
        for i in times.indices.dropFirst() where times[i] <= times[i - 1] { return nil }
        // The type before the first transition: the first non-DST type (RFC 8536 3.2), else type 0.
        let initial = types.first { !$0.dst }?.offset ?? types[0].offset
        return Zone(name: name, transitions: times, offsets: indices.map { types[$0].offset }, initial: initial, rule: rule)
    }

    struct Reader {
        let bytes: [UInt8]
        var at = 0
        init(_ b: [UInt8]) { bytes = b }
        var rest: ArraySlice<UInt8> { bytes[min(at, bytes.count)...] }

        mutating func byte() -> UInt8? {
            guard at < bytes.count else { return nil }
            defer { at += 1 }
            return bytes[at]
        }
        mutating func skip(_ n: Int) -> Bool {
            guard n >= 0, n <= bytes.count - at else { return false }
            at += n
            return true
        }
        mutating func uint32() -> UInt32? {
            guard bytes.count - at >= 4 else { return nil }
            defer { at += 4 }
            return bytes[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) }
        }
        mutating func int32() -> Int32? { uint32().map { Int32(bitPattern: $0) } }
        mutating func int64() -> Int64? {
            guard bytes.count - at >= 8 else { return nil }
            defer { at += 8 }
            return Int64(bitPattern: bytes[at..<at + 8].reduce(0) { $0 << 8 | UInt64($1) })
        }

        struct Header {
            var version: Int
            var isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt: Int
        }

        mutating func header() -> Header? {
            guard bytes.count - at >= 44, bytes[at..<at + 4].elementsEqual("TZif".utf8) else { return nil }
            let v = bytes[at + 4]
            at += 20
            var counts: [Int] = []
            for _ in 0..<6 {
                guard let c = uint32(), c <= 100_000 else { return nil }
                counts.append(Int(c))
            }
            let version = v == 0 ? 1 : Int(v) - 0x30
            return Header(
                version: version, isutcnt: counts[0], isstdcnt: counts[1], leapcnt: counts[2], timecnt: counts[3], typecnt: counts[4],
                charcnt: counts[5])
        }
    }
}
