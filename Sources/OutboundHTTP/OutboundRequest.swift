/// One outbound HTTP request, as ``OutboundHTTPClient/send(_:completion:)`` sends it.
public struct OutboundRequest: Sendable {
    /// The method, sent as given (`GET`, `HEAD`, `POST`, ...).
    public var method: String
    /// An absolute `http://` or `https://` URL.
    public var url: String
    /// Header fields sent in this order. A name must be an HTTP token and a value must not
    /// contain CR, LF or NUL; otherwise the exchange fails with `invalid-url` (a malformed request).
    public var headers: [(String, String)]
    /// The body, or nil for none.
    public var body: [UInt8]?
    /// Seconds the whole exchange may take: connecting, every redirect hop and the body.
    public var timeout: Double
    /// Seconds a connection may take to establish (each hop), capped by what is left of `timeout`.
    public var connectTimeout: Double
    /// Body bytes kept; reading stops there and the response is marked `truncated`.
    public var maxResponseBytes: Int
    /// Bytes of status line plus header lines accepted per response; more is `invalid-response`.
    public var maxHeaderBytes: Int
    /// Whether a 3xx with a `Location` is followed (``RedirectPolicy``) or is itself the answer.
    /// A relay (the cluster's forwarder) turns it off: the client must see the 3xx unchanged.
    public var followRedirects: Bool
    /// Whether proxies from the environment (`http_proxy`, `no_proxy`, ...) apply. The
    /// forwarder turns it off: an instance talks to its peers directly, never through a proxy
    /// that was configured for webhooks and the `http` kind.
    public var useProxy: Bool
    /// Whether the URL's path is sent exactly as given. Off, libcurl resolves dot segments
    /// (`/a/../b` goes out as `/b`), as a browser does. The forwarder turns it on: the owner must
    /// route the path this instance routed, not another one.
    public var pathAsIs: Bool

    /// A request with the given parts; limits default to 30 s, 64 KiB of body, 64 KiB of headers;
    /// redirects are followed, environment proxies apply and dot segments are resolved.
    public init(
        method: String, url: String, headers: [(String, String)] = [], body: [UInt8]? = nil,
        timeout: Double = 30, connectTimeout: Double = 10,
        maxResponseBytes: Int = 64 * 1024, maxHeaderBytes: Int = 64 * 1024,
        followRedirects: Bool = true, useProxy: Bool = true, pathAsIs: Bool = false
    ) {
        self.pathAsIs = pathAsIs
        self.followRedirects = followRedirects
        self.useProxy = useProxy
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.connectTimeout = connectTimeout
        self.maxResponseBytes = maxResponseBytes
        self.maxHeaderBytes = maxHeaderBytes
    }
}

/// The final response of an exchange (after any redirects that were followed).
public struct OutboundResponse: Sendable {
    /// The status code (100-999 as the target sent it).
    public var status: Int
    /// Header fields of the final response in the order received; values decoded lossily.
    public var headers: [(String, String)]
    /// At most `maxResponseBytes` of the body.
    public var body: [UInt8]
    /// True when the body was longer than `maxResponseBytes` and reading stopped.
    public var truncated: Bool
    /// Body bytes received. When `truncated`, counting stopped shortly after the cap.
    public var size: Int
    /// The `Content-Length` the target declared, when it declared a valid one.
    public var contentLength: Int?
    /// The URL of the final response.
    public var finalURL: String
    /// Redirects followed before it.
    public var redirects: Int

    /// A response with the given parts.
    public init(
        status: Int, headers: [(String, String)] = [], body: [UInt8] = [], truncated: Bool = false,
        size: Int = 0, contentLength: Int? = nil, finalURL: String = "", redirects: Int = 0
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.truncated = truncated
        self.size = size
        self.contentLength = contentLength
        self.finalURL = finalURL
        self.redirects = redirects
    }
}

/// Why an exchange produced no response. Never a trap: every failure of the target, the
/// network or the request's own URL ends up here.
public struct OutboundError: Error, Sendable, Equatable, CustomStringConvertible {
    /// One of `timeout`, `connection-refused`, `dns`, `tls`, `network`,
    /// `too-many-redirects`, `redirect-refused`, `invalid-response`, `cancelled`, `invalid-url`
    /// (the request's URL, or another part of the request, is malformed).
    public var type: String
    /// What happened, for people (includes the URL and libcurl's message where there is one).
    public var detail: String

    /// An error of the given type.
    public init(type: String, detail: String) {
        self.type = type
        self.detail = detail
    }

    /// `type: detail`.
    public var description: String { "\(type): \(detail)" }
}
