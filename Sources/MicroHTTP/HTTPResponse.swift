/// A complete HTTP response: status, header fields and body.
public struct HTTPResponse: Sendable {
    /// The status code; values outside 100...999 are sent as 500.
    public var status: Int
    /// Header fields as `(name, value)` pairs, sent in order. `Content-Length` is set by the server.
    public var headers: [(String, String)]
    /// The body bytes.
    public var body: [UInt8]

    /// Creates a response.
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

extension HTTPResponse {
    /// An `application/problem+json` (RFC 9457) response.
    static func problem(
        status: Int, type: String, title: String, detail: String, extraHeaders: [(String, String)] = []
    ) -> HTTPResponse {
        var json = #"{"type":"#
        appendJSONString(type, to: &json)
        json += #","title":"#
        appendJSONString(title, to: &json)
        json += #","status":\#(status),"detail":"#
        appendJSONString(detail, to: &json)
        json += "}"
        return HTTPResponse(
            status: status,
            headers: [("Content-Type", "application/problem+json")] + extraHeaders,
            body: Array(json.utf8)
        )
    }

    static func payloadTooLarge(bodyBytes: Int, limit: Int) -> HTTPResponse {
        .problem(
            status: 413, type: "https://opqd.dev/problems/payload-too-large", title: "Payload Too Large",
            detail: "request body is \(bodyBytes) bytes; the limit is \(limit) bytes (--max-body)")
    }

    static func headersTooLarge(bytes: Int, limit: Int) -> HTTPResponse {
        .problem(
            status: 431, type: "https://opqd.dev/problems/headers-too-large", title: "Request Header Fields Too Large",
            detail: "the request line and header fields are \(bytes) bytes; the limit (--max-header-bytes) is \(limit) bytes")
    }

    static let badFraming = HTTPResponse.problem(
        status: 400, type: "https://opqd.dev/problems/bad-framing", title: "Bad Request",
        detail: "Content-Length must be one decimal number and may not come with Transfer-Encoding", extraHeaders: [("Connection", "close")])

    static let internalError = HTTPResponse.problem(
        status: 500, type: "https://opqd.dev/problems/internal-error", title: "Internal Server Error",
        detail: "the server failed to handle the request")

    static let shuttingDown = HTTPResponse.problem(
        status: 503, type: "https://opqd.dev/problems/shutting-down", title: "Service Unavailable",
        detail: "the server is shutting down", extraHeaders: [("Connection", "close")])
}

private func appendJSONString(_ string: String, to json: inout String) {
    json += "\""
    for scalar in string.unicodeScalars {
        switch scalar {
        case "\"": json += "\\\""
        case "\\": json += "\\\\"
        case "\n": json += "\\n"
        case "\r": json += "\\r"
        case "\t": json += "\\t"
        case _ where scalar.value < 0x20:
            let hex = String(scalar.value, radix: 16)
            json += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
        default: json.unicodeScalars.append(scalar)
        }
    }
    json += "\""
}
