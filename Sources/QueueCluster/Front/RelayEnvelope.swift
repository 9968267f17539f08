import MicroHTTP

/// Several forwarded requests in one exchange between two instances (`POST /v1/cluster/relay`,
/// API.md "Many instances"), and their answers in one reply, in the same order.
///
/// Why: at N instances a load balancer sends (N−1)/N of the creates to an instance that does
/// not hold their queue, and each one forwarded alone costs an HTTP exchange on both sides and
/// about four thread wake-ups (CLUSTER.md "Where the cost goes"). A forwarder that has several
/// creates waiting for the same holder sends them together (`RelayLanes`); the holder runs each
/// as if it had come alone, and its writer commits them together.
///
/// The format is binary, big-endian, every length checked against what is left before it is
/// used; anything malformed (a field named twice too) is refused whole, before any request in
/// it is run:
///
///     request:  "OPQDRELAY1" u16 count (1…maxRequests), then per request:
///               u8 method length, method; u16 path length, path;
///               u16 query count, per pair u16 + name, u16 + value;
///               u16 header count, per field u16 + name, u32 + value; u32 body length, body
///     response: "OPQDRELAY1" u16 count, then per answer:
///               u16 status; u16 header count, per field u16 + name, u32 + value; u32 + body
enum RelayEnvelope {
    static let path = "/v1/cluster/relay"
    static let contentType = "application/octet-stream"
    /// On a relayed request's 503 (with `Opqd-Unstarted`): it did nothing there and goes again
    /// alone (`RelayedHold`).
    static let aloneHeader = "Opqd-Relay-Alone"

    /// True for a relayed request's answer that hands it back (`RelayedHold.handedBack`): 503
    /// with `aloneHeader: 1`, whatever the field name's case.
    static func isHandedBack(status: Int, headers: [(String, String)]) -> Bool {
        status == 503 && headers.contains { $0.1 == "1" && $0.0.lowercased() == aloneHeaderLowercased }
    }

    private static let aloneHeaderLowercased = aloneHeader.lowercased()
    /// On an envelope: its sender sends alone what is answered with `aloneHeader` (a sender of
    /// an older version does not, and its creates are held or sent on at the holder instead).
    static let handBackHeader = "opqd-relay-hands-back"
    static let magic = Array("OPQDRELAY1".utf8)
    /// The most requests one envelope carries (a forwarder sends at most `RelayLanes.maxBatch`).
    static let maxRequests = 256
    static let maxFields = 256
    static let maxFieldBytes = 64 << 10

    /// One request as it goes in an envelope: what `Forwarder.outboundRequest` would send alone.
    struct Inner: Sendable {
        var method: String
        var path: String
        var query: [String: String]
        var headers: [(String, String)]
        var body: [UInt8]
    }

    /// True when `inner` goes in an envelope exactly as it is (the encoder cuts nothing it
    /// was given only because `fits` said so; what does not fit is sent alone).
    static func fits(_ inner: Inner) -> Bool {
        guard (1...16).contains(inner.method.utf8.count), (1...0xFFFF).contains(inner.path.utf8.count), inner.query.count <= maxFields,
            inner.headers.count <= maxFields, inner.body.count <= Int(UInt32.max)
        else { return false }
        for (name, value) in inner.query where name.utf8.count > 0xFFFF || value.utf8.count > 0xFFFF { return false }
        var names = Set<String>()
        for (name, value) in inner.headers {
            guard (1...0xFFFF).contains(name.utf8.count), value.utf8.count <= maxFieldBytes, names.insert(asciiLowercased(name)).inserted else { return false }
        }
        return true
    }

    static func encode(_ requests: [Inner]) -> [UInt8] {
        var out = Writer()
        out.bytes(magic)
        out.u16(requests.count)
        for r in requests {
            out.u8(r.method.utf8.count)
            out.bytes(Array(r.method.utf8))
            out.string16(r.path)
            out.u16(r.query.count)
            for (name, value) in r.query.sorted(by: { $0.key < $1.key }) {
                out.string16(name)
                out.string16(value)
            }
            out.fields(r.headers)
            out.u32(r.body.count)
            out.bytes(r.body)
        }
        return out.buffer
    }

    /// The requests of an envelope, each with the envelope's `id`; nil when anything in it is
    /// malformed or past a bound.
    static func decodeRequests(_ bytes: [UInt8], id: UInt64) -> [HTTPRequest]? {
        var r = Reader(bytes)
        guard r.magic(), let count = r.u16(), (1...maxRequests).contains(count) else { return nil }
        var requests: [HTTPRequest] = []
        requests.reserveCapacity(count)
        for _ in 0..<count {
            guard let methodLength = r.u8(), (1...16).contains(methodLength), let method = r.string(methodLength),
                let pathLength = r.u16(), pathLength >= 1, let path = r.string(pathLength), path.utf8.first == UInt8(ascii: "/"),
                let queryCount = r.u16(), queryCount <= maxFields
            else { return nil }
            var query: [String: String] = [:]
            for _ in 0..<queryCount {
                guard let nameLength = r.u16(), let name = r.string(nameLength), let valueLength = r.u16(), let value = r.string(valueLength)
                else { return nil }
                // The forwarder sends one value per name (a repeat is refused before it forwards).
                guard query.updateValue(value, forKey: name) == nil else { return nil }
            }
            guard let fields = r.fields() else { return nil }
            var headers: [String: String] = [:]
            for (name, value) in fields {
                // A forwarder sends each field once (its request's fields, already joined).
                guard headers.updateValue(value, forKey: asciiLowercased(name)) == nil else { return nil }
            }
            guard let bodyLength = r.u32(), let body = r.take(bodyLength) else { return nil }
            requests.append(HTTPRequest(id: id, method: method, path: path, query: query, headers: headers, body: Array(body)))
        }
        guard r.atEnd else { return nil }
        return requests
    }

    static func encode(_ responses: [HTTPResponse]) -> [UInt8] {
        var out = Writer()
        out.bytes(magic)
        out.u16(responses.count)
        for r in responses {
            out.u16(min(max(r.status, 0), 999))
            out.fields(r.headers)
            out.u32(r.body.count)
            out.bytes(r.body)
        }
        return out.buffer
    }

    /// The answers of a reply, exactly `expected` of them; nil when malformed.
    static func decodeResponses(_ bytes: [UInt8], expected: Int) -> [(status: Int, headers: [(String, String)], body: [UInt8])]? {
        var r = Reader(bytes)
        guard r.magic(), let count = r.u16(), count == expected else { return nil }
        var answers: [(status: Int, headers: [(String, String)], body: [UInt8])] = []
        answers.reserveCapacity(count)
        for _ in 0..<count {
            guard let status = r.u16(), (100...999).contains(status), let fields = r.fields(), let bodyLength = r.u32(), let body = r.take(bodyLength)
            else { return nil }
            answers.append((status, fields, Array(body)))
        }
        guard r.atEnd else { return nil }
        return answers
    }

    struct Writer {
        var buffer: [UInt8] = []
        mutating func u8(_ v: Int) { buffer.append(UInt8(truncatingIfNeeded: v)) }
        mutating func u16(_ v: Int) {
            buffer.append(UInt8(truncatingIfNeeded: v >> 8))
            buffer.append(UInt8(truncatingIfNeeded: v))
        }
        mutating func u32(_ v: Int) {
            for shift in [24, 16, 8, 0] { buffer.append(UInt8(truncatingIfNeeded: v >> shift)) }
        }
        mutating func bytes(_ b: [UInt8]) { buffer.append(contentsOf: b) }
        /// A string of at most 65,535 bytes (longer ones are cut: no path, name or query value
        /// the server accepted is that long).
        mutating func string16(_ s: String) {
            let b = Array(s.utf8.prefix(0xFFFF))
            u16(b.count)
            bytes(b)
        }
        mutating func fields(_ fields: [(String, String)]) {
            let kept = fields.prefix(RelayEnvelope.maxFields)
            u16(kept.count)
            for (name, value) in kept {
                string16(name)
                let v = Array(value.utf8.prefix(RelayEnvelope.maxFieldBytes))
                u32(v.count)
                bytes(v)
            }
        }
    }

    struct Reader {
        let bytes: [UInt8]
        var at = 0
        init(_ bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { at == bytes.count }
        var left: Int { bytes.count - at }

        mutating func magic() -> Bool {
            guard let m = take(RelayEnvelope.magic.count) else { return false }
            return m.elementsEqual(RelayEnvelope.magic)
        }
        mutating func take(_ n: Int) -> ArraySlice<UInt8>? {
            guard n >= 0, n <= left else { return nil }
            defer { at += n }
            return bytes[at..<(at + n)]
        }
        mutating func u8() -> Int? { take(1).map { Int($0[$0.startIndex]) } }
        mutating func u16() -> Int? { take(2).map { $0.reduce(0) { $0 << 8 | Int($1) } } }
        mutating func u32() -> Int? { take(4).map { $0.reduce(0) { $0 << 8 | Int($1) } } }
        mutating func string(_ n: Int) -> String? { take(n).map { String(decoding: $0, as: UTF8.self) } }
        mutating func fields() -> [(String, String)]? {
            guard let count = u16(), count <= RelayEnvelope.maxFields else { return nil }
            var fields: [(String, String)] = []
            fields.reserveCapacity(count)
            for _ in 0..<count {
                guard let nameLength = u16(), nameLength >= 1, let name = string(nameLength), let valueLength = u32(),
                    valueLength <= RelayEnvelope.maxFieldBytes,
                    let value = string(valueLength)
                else { return nil }
                fields.append((name, value))
            }
            return fields
        }
    }
}
