import MicroHTTP

/// A raw HTTP/1.1 request read leniently from fuzz bytes, then handed over field by field the
/// way libmicrohttpd 0.9.75 and `MicroHTTP/Bridge` do:
///
/// - the path is the request target as sent, up to the first `?` (the bridge takes it from
///   MHD's URI log callback, before any decoding), so `x/v1/queues`, `*` and
///   `http://h/v1/queues` reach the handler as they would from a socket;
/// - query arguments are split on `&` and the first `=`, `+` becomes a space and valid `%XX`
///   escapes are decoded (MHD's `MHD_unescape_plus` + `MHD_http_unescape`; `%00` stays a NUL
///   inside the value); a name without `=` gets the empty value; the last repeat wins;
/// - header names are lowercased ASCII, values trimmed of SP/HT, repeats joined with `", "`
///   (`"; "` for `cookie`); method, target and header lines are C strings (cut at a NUL);
/// - bytes are turned into Swift strings with replacement of invalid UTF-8, as the bridge does.
///
/// Leniency where MHD would refuse (so that the fuzzer gets past the framing): bare LF line
/// ends, a header line without a colon is skipped (MHD answers 400), a body is the rest of the
/// input when there is no `Content-Length` (MHD would read none), chunked bodies are decoded
/// as far as they are well-formed.
struct RawRequest {
    var request: HTTPRequest
    /// `Content-Length` as the bridge reads it (`Int(value)`), for its 413 check.
    var declaredBodyBytes: Int?

    init?(_ bytes: ArraySlice<UInt8>, id: UInt64) {
        var lines = LineReader(bytes)
        // Empty lines before the request line are ignored (RFC 9112 2.2).
        var requestLine: ArraySlice<UInt8>? = nil
        while let line = lines.next() {
            if !line.isEmpty { requestLine = line; break }
        }
        guard let requestLine else { return nil }
        let (method, target) = Self.splitRequestLine(cString(requestLine))

        var headers: [String: String] = [:]
        var lastName: String? = nil
        while let line = lines.next() {
            if line.isEmpty { break }
            let line = cString(line)
            if let first = line.first, first == 0x20 || first == 0x09 {
                // Obsolete line folding: continues the previous field's value.
                if let name = lastName, let value = headers[name] {
                    let more = trim(line)
                    headers[name] = value + " " + String(decoding: more, as: UTF8.self)
                }
                continue
            }
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { continue }
            let name = String(decoding: line[line.startIndex..<colon].map { $0 &- 65 < 26 ? $0 | 0x20 : $0 }, as: UTF8.self)
            let value = String(decoding: trim(line[(colon + 1)...]), as: UTF8.self)
            if let earlier = headers.updateValue(value, forKey: name) {
                headers[name] = earlier + (name == "cookie" ? "; " : ", ") + value
            }
            lastName = name
        }
        let rest = lines.rest

        var body: [UInt8]
        let declared = headers["content-length"].flatMap { Int($0) }
        if let te = headers["transfer-encoding"], te.lowercased().contains("chunked") {
            body = Self.dechunk(rest)
        } else if let declared, declared >= 0 {
            body = Array(rest.prefix(declared))
        } else {
            body = Array(rest)
        }
        if body.count > 1 << 20 { body = Array(body.prefix(1 << 20)) }

        let pathEnd = target.firstIndex(of: UInt8(ascii: "?")) ?? target.endIndex
        let path = String(decoding: target[target.startIndex..<pathEnd], as: UTF8.self)
        let query = pathEnd < target.endIndex ? Self.arguments(target[(pathEnd + 1)...]) : (values: [:], repeated: [])
        request = HTTPRequest(
            id: id, method: String(decoding: method, as: UTF8.self), path: path,
            query: query.values, repeatedQueryNames: query.repeated, headers: headers, body: body)
        declaredBodyBytes = declared.flatMap { $0 > 0 ? $0 : nil }
    }

    /// `METHOD SP target [SP HTTP/x.y]`; a line with no space is all method and no target.
    static func splitRequestLine(_ line: ArraySlice<UInt8>) -> (ArraySlice<UInt8>, ArraySlice<UInt8>) {
        guard let space = line.firstIndex(of: 0x20) else { return (line, line[line.endIndex...]) }
        let method = line[line.startIndex..<space]
        var rest = line[(space + 1)...]
        while rest.first == 0x20 { rest = rest.dropFirst() }
        if let last = rest.lastIndex(of: 0x20), rest[(last + 1)...].starts(with: "HTTP/".utf8) {
            rest = rest[rest.startIndex..<last]
            while rest.last == 0x20 { rest = rest.dropLast() }
        }
        return (method, rest)
    }

    /// MHD's argument parsing of the query string (see the type's comment).
    /// The arguments, and the names given more than once, as MicroHTTP's bridge collects them.
    static func arguments(_ query: ArraySlice<UInt8>) -> (values: [String: String], repeated: [String]) {
        var result: [String: String] = [:]
        var repeated: [String] = []
        for part in query.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: false) {
            if part.isEmpty && part.endIndex == query.endIndex { continue }  // "a=1&" adds nothing at the end
            let key: ArraySlice<UInt8>, value: ArraySlice<UInt8>
            if let eq = part.firstIndex(of: UInt8(ascii: "=")) {
                key = part[part.startIndex..<eq]
                value = part[(eq + 1)...]
            } else {
                key = part
                value = []
            }
            let name = String(decoding: unescape(key), as: UTF8.self)
            if result.updateValue(String(decoding: unescape(value), as: UTF8.self), forKey: name) != nil, repeated.count < 64, !repeated.contains(name) {
                repeated.append(name)
            }
        }
        return (result, repeated)
    }

    /// `+` to space, then valid `%XX` to its byte; anything else as is.
    static func unescape(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = bytes.startIndex
        while i < bytes.endIndex {
            let c = bytes[i]
            if c == UInt8(ascii: "%"), i + 2 < bytes.endIndex, let h = hex(bytes[i + 1]), let l = hex(bytes[i + 2]) {
                out.append(h << 4 | l)
                i += 3
                continue
            }
            out.append(c == UInt8(ascii: "+") ? 0x20 : c)
            i += 1
        }
        return out
    }

    static func hex(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// Chunked transfer coding, as far as it is well-formed.
    static func dechunk(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        var out: [UInt8] = []
        var lines = LineReader(bytes)
        while let sizeLine = lines.next() {
            let digits = sizeLine.prefix { $0 != UInt8(ascii: ";") }
            guard !digits.isEmpty, digits.count <= 8, let size = Int(String(decoding: trim(digits), as: UTF8.self), radix: 16), size > 0 else { break }
            let data = lines.take(size)
            out.append(contentsOf: data)
            if data.count < size { break }
            _ = lines.next()  // the CRLF after the data
        }
        return out
    }
}

/// Lines ending in LF (a CR before it is dropped), and what is left after them.
struct LineReader {
    var rest: ArraySlice<UInt8>
    init(_ bytes: ArraySlice<UInt8>) { rest = bytes }

    mutating func next() -> ArraySlice<UInt8>? {
        guard !rest.isEmpty else { return nil }
        guard let lf = rest.firstIndex(of: 0x0A) else {
            let line = rest
            rest = rest[rest.endIndex...]
            return line
        }
        var line = rest[rest.startIndex..<lf]
        if line.last == 0x0D { line = line.dropLast() }
        rest = rest[(lf + 1)...]
        return line
    }

    mutating func take(_ n: Int) -> ArraySlice<UInt8> {
        let taken = rest.prefix(n)
        rest = rest.dropFirst(taken.count)
        return taken
    }
}

/// A C string's view of bytes: up to the first NUL.
func cString(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
    bytes.prefix { $0 != 0 }
}

/// Without leading and trailing SP and HT.
func trim(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
    var b = bytes
    while let f = b.first, f == 0x20 || f == 0x09 { b = b.dropFirst() }
    while let l = b.last, l == 0x20 || l == 0x09 { b = b.dropLast() }
    return b
}
