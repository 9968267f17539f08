import MicroHTTP

/// What every answer must look like, whatever the request (API.md "Errors"); a violation stops
/// the fuzzer like a crash. `FUZZ_REQUEST_NO_CHECKS=1` turns these off (crashes only).
enum Checks {
    static func fail(_ what: String, _ request: String, _ response: HTTPResponse? = nil) -> Never {
        var message = "fuzz-request check failed: \(what) (request \(request))"
        if let response {
            message += "; answer \(response.status) \(response.headers) \(String(decoding: response.body.prefix(400), as: UTF8.self))"
        }
        fatalError(message)
    }

    static func header(_ r: HTTPResponse, _ name: String) -> String? {
        r.headers.first { $0.0.lowercased() == name }?.1
    }

    static func response(_ r: HTTPResponse, _ request: String) {
        guard (100...599).contains(r.status) else { fail("status out of range", request, r) }
        if r.status == 500 { fail("500: a handler failed unexpectedly", request, r) }
        headers(r.headers, request, r)
        let type = header(r, "content-type")
        if r.status >= 400 {
            guard type == "application/problem+json" else { fail("an error answer that is not application/problem+json", request, r) }
            guard JSONCheck.isValid(r.body) else { fail("problem body is not valid JSON", request, r) }
            let status = Array(#""status":\#(r.status),"#.utf8)
            guard r.body.starts(with: #"{"type":"https://opqd.dev/problems/"#.utf8),
                r.body.indices.contains(where: { r.body[$0...].starts(with: status) })
            else {
                fail("problem body without its type or status", request, r)
            }
        } else if let type, type.hasPrefix("application/json") {
            guard JSONCheck.isValid(r.body) else { fail("JSON answer that is not valid JSON", request, r) }
        }
        // A batch creates many operations, each named by the id in its status: there is no one
        // resource for a Location (RFC 9110 15.3.2: without one, the target URI identifies it).
        if r.status == 201 && header(r, "location") == nil && !request.hasPrefix("POST /v1/operations:batch") {
            fail("201 without Location", request, r)
        }
        if r.status == 405 && header(r, "allow") == nil { fail("405 without Allow", request, r) }
        if r.status == 401 && header(r, "www-authenticate") == nil { fail("401 without WWW-Authenticate", request, r) }
    }

    /// MHD refuses header fields with CR, LF or NUL (the field would silently go missing).
    static func headers(_ headers: [(String, String)], _ request: String, _ r: HTTPResponse? = nil) {
        for (name, value) in headers {
            if name.isEmpty || name.utf8.contains(where: { $0 <= 0x20 || $0 == UInt8(ascii: ":") || $0 >= 0x7F }) {
                fail("header name \(name.debugDescription) is not a token", request, r)
            }
            if value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) {
                fail("header \(name) has CR, LF or NUL: \(value.debugDescription)", request, r)
            }
        }
    }

    static func stream(status: Int, headers hs: [(String, String)], _ request: String) {
        guard status == 200 else { fail("stream with status \(status)", request) }
        headers(hs, request)
    }

    /// Every `data:` line of a stream is one JSON object.
    static func sse(_ bytes: [UInt8], _ request: String) {
        guard !bytes.isEmpty else { return }
        for line in bytes.split(separator: 0x0A) where line.starts(with: "data: ".utf8) {
            guard JSONCheck.isValid(Array(line.dropFirst(6))) else {
                fail("stream data that is not JSON: \(String(decoding: line.prefix(300), as: UTF8.self))", request)
            }
        }
    }
}

/// RFC 8259 validation without a depth limit (answers nest user JSON a level or two deeper
/// than the request parser's limit of 64).
enum JSONCheck {
    static func isValid(_ b: [UInt8]) -> Bool {
        guard String(validating: b, as: UTF8.self) != nil else { return false }
        var i = 0
        func ws() { while i < b.count, b[i] == 0x20 || b[i] == 0x09 || b[i] == 0x0A || b[i] == 0x0D { i += 1 } }
        func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }
        func literal(_ w: String) -> Bool {
            for c in w.utf8 { guard i < b.count, b[i] == c else { return false }; i += 1 }
            return true
        }
        func string() -> Bool {
            i += 1
            while i < b.count {
                let c = b[i]
                if c == 0x22 { i += 1; return true }
                if c < 0x20 { return false }
                if c == 0x5C {
                    i += 1
                    guard i < b.count else { return false }
                    switch b[i] {
                    case 0x22, 0x5C, 0x2F, 0x62, 0x66, 0x6E, 0x72, 0x74: i += 1
                    case 0x75:
                        guard i + 4 < b.count, b[(i + 1)...(i + 4)].allSatisfy({ RawRequest.hex($0) != nil }) else { return false }
                        i += 5
                    default: return false
                    }
                    continue
                }
                i += 1
            }
            return false
        }
        func number() -> Bool {
            if b[i] == 0x2D { i += 1 }
            guard i < b.count, isDigit(b[i]) else { return false }
            if b[i] == 0x30 { i += 1 } else { while i < b.count, isDigit(b[i]) { i += 1 } }
            if i < b.count, b[i] == 0x2E {
                i += 1
                guard i < b.count, isDigit(b[i]) else { return false }
                while i < b.count, isDigit(b[i]) { i += 1 }
            }
            if i < b.count, b[i] == 0x65 || b[i] == 0x45 {
                i += 1
                if i < b.count, b[i] == 0x2B || b[i] == 0x2D { i += 1 }
                guard i < b.count, isDigit(b[i]) else { return false }
                while i < b.count, isDigit(b[i]) { i += 1 }
            }
            return true
        }
        func value(_ depth: Int) -> Bool {
            guard depth < 10_000, i < b.count else { return false }
            switch b[i] {
            case 0x7B, 0x5B:
                let close: UInt8 = b[i] == 0x7B ? 0x7D : 0x5D
                let isObject = close == 0x7D
                i += 1
                ws()
                if i < b.count, b[i] == close { i += 1; return true }
                while true {
                    ws()
                    if isObject {
                        guard i < b.count, b[i] == 0x22, string() else { return false }
                        ws()
                        guard i < b.count, b[i] == 0x3A else { return false }
                        i += 1
                        ws()
                    }
                    guard value(depth + 1) else { return false }
                    ws()
                    guard i < b.count else { return false }
                    if b[i] == 0x2C { i += 1; continue }
                    if b[i] == close { i += 1; return true }
                    return false
                }
            case 0x22: return string()
            case 0x74: return literal("true")
            case 0x66: return literal("false")
            case 0x6E: return literal("null")
            default: return number()
            }
        }
        ws()
        guard value(0) else { return false }
        ws()
        return i == b.count
    }
}
