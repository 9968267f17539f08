import MicroHTTP

/// One file of the dashboard, compiled into the binary by `scripts/embed-dashboard.sh`.
struct DashboardAsset: Sendable {
    let contentType: String
    /// A strong validator: a hash of the bytes.
    let etag: String
    let bytes: [UInt8]

    init(contentType: String, etag: String, text: String) {
        self.contentType = contentType
        self.etag = etag
        self.bytes = Array(text.utf8)
    }
}

/// The dashboard (API.md "Dashboard"): the page at `GET /` with its stylesheet and script, open
/// to everyone like `/healthz` (the page asks for the token itself), and `GET /v1/access`, which
/// tells the page what the token it holds may do.
package struct DashboardController: Sendable {
    package init(access: Access) {
        self.access = access
    }

    let access: Access

    /// Scripts and styles from this origin only (so no inline script or style), requests to this
    /// origin only, and the page may not be framed, post forms, or change its base URL.
    static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/", scope: .instance, access: .open) { req, _ in Self.serve(dashboardHTML, req) }
        r.add("GET", "/dashboard.css", scope: .instance, access: .open) { req, _ in Self.serve(dashboardCSS, req) }
        r.add("GET", "/dashboard.js", scope: .instance, access: .open) { req, _ in Self.serve(dashboardJS, req) }
        r.add("GET", "/v1/access", scope: .instance) { req, _ in try whoAmI(req) }
    }

    /// A query is ignored: the page keeps its own state in the URL's fragment.
    static func serve(_ asset: DashboardAsset, _ req: HTTPRequest) -> HTTPHandlerResult {
        let headers: [(String, String)] = [
            ("Content-Security-Policy", contentSecurityPolicy),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("X-Frame-Options", "DENY"),
            // Revalidated on every load: a new binary's page is used at once, and an unchanged
            // one costs a 304.
            ("Cache-Control", "no-cache"),
            ("ETag", asset.etag),
        ]
        if ETag.matches(req, asset.etag) {
            return .response(HTTPResponse(status: 304, headers: headers))
        }
        return .response(HTTPResponse(status: 200, headers: [("Content-Type", asset.contentType)] + headers, body: asset.bytes))
    }

    /// `{"access": "write" | "read"}`: what the presented token may do ("write" when the server
    /// has no token). A missing or wrong token never gets here: the route needs a token like any
    /// other `GET /v1/...`.
    func whoAmI(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let level: String
        switch access.credential(req) {
        case .full: level = "write"
        case .read: level = "read"
        case .none: throw Access.unauthorized  // unreachable behind `Access.refusal`; never open
        }
        return .response(json(200, Array("{\"access\":\"\(level)\"}".utf8), [("Cache-Control", "no-store")]))
    }
}
