/// One HTTP request, fully received (headers and body), as the handler sees it.
public struct HTTPRequest: Sendable {
    /// Server-wide, increasing request id (starts at 1 for each server).
    public let id: UInt64
    /// The method, e.g. `"GET"` or `"POST"`.
    public let method: String
    /// The path as sent, without the query string and not percent-decoded.
    public let path: String
    /// Query arguments, percent-decoded; when a name repeats, the last value wins (and the name
    /// is in ``repeatedQueryNames``).
    public let query: [String: String]
    /// The query argument names given more than once, in order of their second appearance:
    /// an API that refuses ambiguity (`?limit=0x10&limit=5`) reads them here.
    public let repeatedQueryNames: [String]
    /// Header fields keyed by lowercased name; repeated fields are joined with `", "` (`"; "` for
    /// `Cookie`).
    public let headers: [String: String]
    /// The request body (empty when there is none).
    public let body: [UInt8]

    /// Creates a request value (the server builds these; tests and routers may too).
    public init(
        id: UInt64 = 0,
        method: String,
        path: String,
        query: [String: String] = [:],
        repeatedQueryNames: [String] = [],
        headers: [String: String] = [:],
        body: [UInt8] = []
    ) {
        self.id = id
        self.method = method
        self.path = path
        self.query = query
        self.repeatedQueryNames = repeatedQueryNames
        self.headers = headers
        self.body = body
    }

    /// The value of header `name`, matched case-insensitively.
    public func header(_ name: String) -> String? {
        if let value = headers[name] { return value }
        // The keys are lowercase: a name with no upper-case letter that missed is absent (most
        // lookups, e.g. of fields a request does not carry, end here without a second hash).
        guard name.utf8.contains(where: { $0 &- 65 < 26 }) else { return nil }
        return headers[asciiLowercased(name)]
    }
}

/// Lowercases ASCII letters only (header names are ASCII tokens), without Foundation.
@inline(__always)
package func asciiLowercased(_ string: String) -> String {
    // Most names arrive lowercase already: no copy for them.
    guard string.utf8.contains(where: { $0 &- 65 < 26 }) else { return string }
    var utf8 = Array(string.utf8)
    var changed = false
    for index in utf8.indices where utf8[index] &- 65 < 26 {
        utf8[index] |= 0x20
        changed = true
    }
    return changed ? String(decoding: utf8, as: UTF8.self) : string
}
