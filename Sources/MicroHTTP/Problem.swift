/// An RFC 9457 problem: every 4xx/5xx answer, the server's own (413, 431, 400, 500, 503) and the
/// application's, is one. The `type` URI is `https://opqd.dev/problems/<slug>`.
public struct Problem: Error, Sendable {
    public var status: Int
    /// Short slug naming the kind of problem; clients branch on it, so it never changes meaning.
    public var slug: String
    public var title: String
    public var detail: String
    public var headers: [(String, String)] = []

    public init(_ status: Int, _ slug: String, _ title: String, _ detail: String, headers: [(String, String)] = []) {
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = headers
    }

    /// The `application/problem+json` answer.
    public var response: HTTPResponse {
        var out: [UInt8] = []
        out.reserveCapacity(160 + detail.utf8.count)
        out.append(contentsOf: #"{"type":"https://opqd.dev/problems/"#.utf8)
        appendJSONStringBody(slug, to: &out)
        out.append(contentsOf: #"","title":"#.utf8)
        appendJSONString(title, to: &out)
        out.append(contentsOf: #","status":"#.utf8)
        out.append(contentsOf: String(status).utf8)
        out.append(contentsOf: #","detail":"#.utf8)
        appendJSONString(detail, to: &out)
        out.append(UInt8(ascii: "}"))
        return HTTPResponse(status: status, headers: [("Content-Type", "application/problem+json")] + headers, body: out)
    }
}

/// An error that knows its HTTP answer. The one place that turns errors into answers (the
/// application's dispatcher, or the server's own last-resort catch) asks for `problem`; an
/// error that does not conform is a bug and becomes 500 `internal-error`.
public protocol ProblemConvertible: Error {
    var problem: Problem { get }
}

extension Problem: ProblemConvertible {
    public var problem: Problem { self }
}

extension Problem {
    /// The problem for any error: its own when it has one, else 500 `internal-error`
    /// naming the request (the error itself is for the log, never for the client).
    public static func from(_ error: any Error, requestID: UInt64) -> Problem {
        (error as? any ProblemConvertible)?.problem ?? .internalError(requestID: requestID)
    }

    /// The server's own problems; the application uses the same slugs for the same conditions.
    public static func payloadTooLarge(bodyBytes: Int, limit: Int) -> Problem {
        Problem(
            413, "payload-too-large", "Payload Too Large",
            "request body is \(bodyBytes) bytes; the limit is \(limit) bytes (--max-body)")
    }

    public static func headersTooLarge(bytes: Int, limit: Int) -> Problem {
        Problem(
            431, "headers-too-large", "Request Header Fields Too Large",
            "the request line and header fields are \(bytes) bytes; the limit (--max-header-bytes) is \(limit) bytes")
    }

    public static let badFraming = Problem(
        400, "bad-framing", "Bad Request",
        "Content-Length must be one decimal number and may not come with Transfer-Encoding", headers: [("Connection", "close")])

    public static func internalError(requestID: UInt64) -> Problem {
        Problem(500, "internal-error", "Internal Server Error", "the server failed to handle this request (request \(requestID))")
    }

    /// With `Retry-After`: behind a load balancer, or in a cluster whose instance is changing
    /// role (a second or two), the retry finds a server.
    public static let shuttingDown = Problem(
        503, "shutting-down", "Service Unavailable", "the server is shutting down", headers: [("Retry-After", "1"), ("Connection", "close")])

    /// `shuttingDown` for a request refused before any handler saw it (its headers arrived
    /// while the server was stopping): it did nothing, which `unstartedHeader` says, so a peer
    /// that relayed it may send it on to another server. Every other 503 `shutting-down` (a
    /// pending answer at the drain deadline) may come after the request did something.
    public static let refusedUnstarted = Problem(
        503, "shutting-down", "Service Unavailable", "the server is shutting down",
        headers: [("Retry-After", "1"), ("Connection", "close"), (unstartedHeader, "1")])
    public static let unstartedHeader = "Opqd-Unstarted"
}

/// A JSON string literal (quotes included) with the escapes JSON requires.
func appendJSONString(_ string: String, to out: inout [UInt8]) {
    out.append(UInt8(ascii: "\""))
    appendJSONStringBody(string, to: &out)
    out.append(UInt8(ascii: "\""))
}

private func appendJSONStringBody(_ string: String, to out: inout [UInt8]) {
    let hex = Array("0123456789abcdef".utf8)
    for byte in string.utf8 {
        switch byte {
        case UInt8(ascii: "\""): out.append(contentsOf: [0x5C, 0x22])
        case UInt8(ascii: "\\"): out.append(contentsOf: [0x5C, 0x5C])
        case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
        case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
        case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
        case 0..<0x20: out.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
        default: out.append(byte)
        }
    }
}
