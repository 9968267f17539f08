/// The next hop of a redirect, as ``RedirectPolicy/next(status:location:currentURL:method:redirects:)`` decides it.
public struct RedirectHop: Sendable, Equatable {
    /// The absolute URL to request next.
    public var url: String
    /// The method for it (`GET` after a 301/302 POST or any 303, else unchanged).
    public var method: String
    /// Whether the request body is sent again (307 and 308, and 301/302 of non-POST methods).
    public var keepsBody: Bool
    /// True when scheme, host or port differ from the current URL: `Authorization` and
    /// `Cookie` are then not sent.
    public var originChanged: Bool
}

/// What to do with a response.
public enum RedirectDecision: Sendable, Equatable {
    /// Not a redirect, or one without a usable `Location`: the response is the answer.
    case stop
    /// Request ``RedirectHop/url`` next.
    case follow(RedirectHop)
    /// End the exchange with this error (`too-many-redirects` or `redirect-refused`).
    case fail(OutboundError)
}

/// Redirect rules of the outbound client, as a pure function so they can be unit-tested and fuzzed.
public enum RedirectPolicy {
    /// Redirects followed at most; one more is `too-many-redirects`.
    public static let maxRedirects = 5
    /// The statuses that are followed.
    public static let redirectStatuses: Set<Int> = [301, 302, 303, 307, 308]
    /// Header fields not sent to another origin.
    public static let credentialHeaders: Set<String> = ["authorization", "cookie"]

    /// Decides what follows a response with `status` and `location` (the raw `Location`
    /// header value, nil when absent) to `method currentURL`, after `redirects` redirects.
    ///
    /// - A status other than 301, 302, 303, 307, 308, or a missing or blank `Location`: `.stop`.
    /// - `redirects >= maxRedirects`: `too-many-redirects`.
    /// - A `Location` that does not resolve (with libcurl's URL API, against `currentURL`) to
    ///   an http/https URL with a host, of at most ``OutboundURL/maxLength`` bytes: `redirect-refused`.
    /// - 303: GET (HEAD stays HEAD), no body. 301/302: POST becomes GET without body, other
    ///   methods are kept with their body. 307/308: method and body kept.
    public static func next(status: Int, location: String?, currentURL: String, method: String, redirects: Int) -> RedirectDecision {
        guard redirectStatuses.contains(status), let location else { return .stop }
        let trimmed = trim(location)
        guard !trimmed.isEmpty else { return .stop }
        guard redirects < maxRedirects else {
            return .fail(
                OutboundError(
                    type: "too-many-redirects", detail: "more than \(maxRedirects) redirects; the last was \(status) from \(OutboundURL.quoted(currentURL))"))
        }
        let current: OutboundURL.Parts
        switch OutboundURL.check(currentURL) {
        case let .success(p): current = p
        case let .failure(e): return .fail(OutboundError(type: "redirect-refused", detail: "current URL: \(e.detail)"))
        }
        let target: OutboundURL.Parts
        switch OutboundURL.resolve(trimmed, against: current.url, errorType: "redirect-refused") {
        case let .success(p): target = p
        case let .failure(e):
            return .fail(OutboundError(type: "redirect-refused", detail: "\(status) from \(OutboundURL.quoted(currentURL)) to Location \(e.detail)"))
        }
        var newMethod = method
        var keepsBody = true
        switch status {
        case 303:
            newMethod = method == "HEAD" ? "HEAD" : "GET"
            keepsBody = false
        case 301 where method == "POST", 302 where method == "POST":
            newMethod = "GET"
            keepsBody = false
        default:
            break
        }
        return .follow(
            RedirectHop(
                url: target.url, method: newMethod, keepsBody: keepsBody,
                originChanged: target.origin == nil || target.origin != current.origin))
    }

    /// The headers to send on a hop: credentials dropped when the origin changed, and
    /// `Content-Type`/`Content-Length` dropped when the body is not sent again.
    public static func headers(_ headers: [(String, String)], for hop: RedirectHop) -> [(String, String)] {
        headers.filter { name, _ in
            let lower = name.lowercased()
            if hop.originChanged && credentialHeaders.contains(lower) { return false }
            if !hop.keepsBody && (lower == "content-type" || lower == "content-length") { return false }
            return true
        }
    }

    /// `text` without leading and trailing spaces and tabs.
    static func trim(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var start = 0, end = bytes.count
        while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 { start += 1 }
        while end > start, bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09 { end -= 1 }
        return String(decoding: bytes[start..<end], as: UTF8.self)
    }
}
