import MicroHTTP
import QueueEngine

let jsonType = ("Content-Type", "application/json; charset=utf-8")

package func json(_ status: Int, _ body: [UInt8], _ headers: [(String, String)] = []) -> HTTPResponse {
    HTTPResponse(status: status, headers: [jsonType] + headers, body: body)
}

/// Conditional GETs: `ETag`s and `If-None-Match`.
enum ETag {
    static func operation(_ rev: UInt64) -> String { "\"r\(rev)\"" }
    /// An operation's ETag: its revision, and for an unfinished one what holds it back
    /// (`waitingOn` changes with its queue and limiters, not with its revision).
    static func operation(_ op: OperationSnapshot) -> String {
        guard let w = op.waitingOn, !w.isEmpty else { return operation(op.revision) }
        return "\"r\(op.revision)-w\(String(waitingHash(w), radix: 36))\""
    }

    /// FNV-1a of the encoded `waitingOn`.
    static func waitingHash(_ w: [WaitReason]) -> UInt64 {
        var o = JSONOut(capacity: 128)
        o.openArray()
        for r in w { r.write(to: &o) }
        o.closeArray()
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in o.bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        return h
    }
    /// A queue's ETag from durable data alone, so that an owner and a cluster follower reading
    /// the queue's row give the same: its creation stamp, the generation (the run of the engine
    /// that made the revision, counted durably before anything is served) and the revision
    /// (stored with every commit that moves it). A revision shown before a crash but never
    /// committed can come again after it with other content, under another generation.
    static func queue(_ q: QueueSnapshot) -> String { "\"q\(q.createdAt.nanoseconds)-\(q.generation)-\(q.revision)\"" }

    /// Operations' revisions are not bumped durably at a restart: ETags made from them
    /// (listings, observers) also name this process's start, so none handed out before a restart
    /// can match after it.
    static let bootNonce = String(UInt32.random(in: 0...UInt32.max), radix: 36)

    /// A listing's ETag from what each item's revision says (name, a creation stamp, the
    /// revision), hashed in order with FNV-1a: the same items at the same revisions give the
    /// same tag within one process; any change, addition or removal gives another.
    static func list<S: Sequence>(_ items: S) -> String where S.Element == (String, UInt64, UInt64) {
        var h = FNV1a()
        for (name, created, revision) in items { h.item(name, created, revision) }
        return "\"l\(bootNonce)-\(h.count)-\(String(h.value, radix: 36))\""
    }

    /// `GET /v1/queues`'s ETag, from durable data alone like `queue(_:)` (each queue's name,
    /// creation stamp, generation and revision, in order): an owner and a follower reading the
    /// rows give the same tag for the same queues.
    static func queues<S: Sequence>(_ items: S) -> String where S.Element == QueueSnapshot {
        var h = FNV1a()
        for q in items { h.item(q.name, UInt64(bitPattern: q.createdAt.nanoseconds), q.generation, q.revision) }
        return "\"l\(h.count)-\(String(h.value, radix: 36))\""
    }

    /// FNV-1a over listed items.
    private struct FNV1a {
        var value: UInt64 = 0xcbf2_9ce4_8422_2325
        var count: UInt64 = 0
        private mutating func mix(_ v: UInt64) {
            var v = v
            for _ in 0..<8 {
                value = (value ^ (v & 0xff)) &* 0x100_0000_01b3
                v >>= 8
            }
        }
        mutating func item(_ name: String, _ a: UInt64, _ b: UInt64, _ c: UInt64? = nil) {
            for byte in name.utf8 { value = (value ^ UInt64(byte)) &* 0x100_0000_01b3 }
            value = (value ^ 0xff) &* 0x100_0000_01b3  // never in UTF-8: ends the name
            mix(a); mix(b)
            if let c { mix(c) }
            count &+= 1
        }
    }

    static func matches(_ req: HTTPRequest, _ etag: String) -> Bool {
        guard let inm = req.header("if-none-match") else { return false }
        if inm == etag || inm == "*" { return true }
        return inm.split(separator: ",").contains { $0.trimmingSpaces() == etag || $0.trimmingSpaces() == "W/" + etag }
    }

    static func notModified(_ etag: String) -> HTTPHandlerResult {
        .response(HTTPResponse(status: 304, headers: [("ETag", etag)]))
    }
}

/// Actions take no body; an empty object is tolerated for clients that always send one.
func requireNoBody(_ req: HTTPRequest) throws(Problem) {
    if req.body.isEmpty { return }
    _ = try Body(req, allowed: [], emptyIsObject: true)
}

/// A list page under the byte budget (`--max-page-bytes`), less room for the closing brackets
/// and `next`.
func pageBudget(_ limits: APILimits) -> Int { limits.pageBytes - 160 }

extension Substring {
    func trimmingSpaces() -> Substring {
        var s = self
        while s.first == " " { s = s.dropFirst() }
        while s.last == " " { s = s.dropLast() }
        return s
    }
}
