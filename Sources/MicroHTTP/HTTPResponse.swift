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
    static func payloadTooLarge(bodyBytes: Int, limit: Int) -> HTTPResponse {
        Problem.payloadTooLarge(bodyBytes: bodyBytes, limit: limit).response
    }

    static func headersTooLarge(bytes: Int, limit: Int) -> HTTPResponse {
        Problem.headersTooLarge(bytes: bytes, limit: limit).response
    }

    static let badFraming = Problem.badFraming.response
    static let shuttingDown = Problem.shuttingDown.response
    static let refusedUnstarted = Problem.refusedUnstarted.response
}
