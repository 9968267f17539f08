import MicroHTTP
import QueueEngine

let jsonType = ("Content-Type", "application/json; charset=utf-8")

func json(_ status: Int, _ body: [UInt8], _ headers: [(String, String)] = []) -> HTTPResponse {
    HTTPResponse(status: status, headers: [jsonType] + headers, body: body)
}

/// Conditional GETs: `ETag`s and `If-None-Match`.
enum ETag {
    static func operation(_ rev: UInt64) -> String { "\"r\(rev)\"" }
    /// A queue's revision is not persisted with every operation change, so its ETag also
    /// names this process's start: no ETag handed out before a restart can match after it.
    static func queue(_ q: QueueSnapshot) -> String { "\"q\(q.createdAt.nanoseconds)-\(bootNonce)-\(q.revision)\"" }
    static let bootNonce = String(UInt32.random(in: 0...UInt32.max), radix: 36)

    /// A listing's ETag from what each item's revision says (name, a creation stamp, the
    /// revision), hashed in order with FNV-1a: the same items at the same revisions give the
    /// same tag within one process; any change, addition or removal gives another.
    static func list<S: Sequence>(_ items: S) -> String where S.Element == (String, UInt64, UInt64) {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        var n: UInt64 = 0
        func mix(_ v: UInt64) {
            var v = v
            for _ in 0..<8 {
                h = (h ^ (v & 0xff)) &* 0x100_0000_01b3
                v >>= 8
            }
        }
        for (name, created, revision) in items {
            for b in name.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
            h = (h ^ 0xff) &* 0x100_0000_01b3  // never in UTF-8: ends the name
            mix(created); mix(revision)
            n &+= 1
        }
        return "\"l\(bootNonce)-\(n)-\(String(h, radix: 36))\""
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
func pageBudget(_ limits: OpqdConfiguration.Limits) -> Int { limits.pageBytes - 160 }

extension Substring {
    func trimmingSpaces() -> Substring {
        var s = self
        while s.first == " " { s = s.dropFirst() }
        while s.last == " " { s = s.dropLast() }
        return s
    }
}
