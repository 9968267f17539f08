import Foundation
import QueueTesting
import Testing

/// The HTTP side of the dashboard (API.md "Dashboard", "Who may call"); what the page does in a
/// browser is checked by scripts/dashboard-check.sh in headless Chromium.
@Suite("Dashboard")
struct DashboardTests {
    static let csp =
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    static let assets: [(path: String, mediaType: String, marker: String)] = [
        ("/", "text/html", "<!doctype html>"),
        ("/dashboard.css", "text/css", ":root"),
        ("/dashboard.js", "text/javascript", "'use strict'"),
    ]

    @Test("the page and its assets are open with --token, with the security headers, and nothing else is")
    func openWithToken() async throws {
        try await withLiveServer({
            $0.token = "full-secret"; $0.readToken = "read-secret"
        }) { server in
            for asset in Self.assets {
                let r = try await server.request("GET", asset.path)
                #expect(r.status == 200, "\(asset.path) without a token: \(r)")
                #expect(r.mediaType == asset.mediaType, "\(asset.path): \(r.headers["content-type"] ?? "none")")
                #expect(r.headers["content-security-policy"] == Self.csp, "\(asset.path)")
                #expect(r.headers["x-content-type-options"] == "nosniff", "\(asset.path)")
                #expect(r.headers["referrer-policy"] == "no-referrer", "\(asset.path)")
                #expect(r.text.contains(asset.marker), "\(asset.path) body starts \(r.text.prefix(80))")
                #expect(r.headers["content-length"] == String(r.body.count))
                let head = try await server.request("HEAD", asset.path)
                #expect(head.status == 200 && head.body.isEmpty, "HEAD \(asset.path): \(head)")
            }
            // Open means those three routes only: the API next to them still needs the token.
            #expect(try await server.request("GET", "/v1/queues").status == 401)
            #expect(try await server.request("GET", "/dashboard.map").status == 401)
            #expect(try await server.request("GET", "/index.html").status == 401)
            // A trailing slash or an extra segment is another path, not the page.
            #expect(try await server.request("GET", "//").status == 401)
            // Writing to the page is not a thing; without a token that is all one learns.
            let post = try await server.request("POST", "/")
            #expect(post.status == 405, "\(post)")
            #expect(post.headers["allow"] == "GET")
        }
    }

    @Test("ETag: a matching If-None-Match gets 304 with no body; another tag gets the asset")
    func etags() async throws {
        try await withLiveServer { server in
            var tags: Set<String> = []
            for asset in Self.assets {
                let first = try await server.request("GET", asset.path)
                let tag = try #require(first.headers["etag"], "\(asset.path) has an ETag")
                #expect(tag.hasPrefix("\"") && tag.hasSuffix("\"") && tag.count > 10, "strong ETag: \(tag)")
                tags.insert(tag)
                let again = try await server.request("GET", asset.path, headers: ["If-None-Match": tag])
                #expect(again.status == 304, "\(asset.path) with its own ETag: \(again)")
                #expect(again.body.isEmpty)
                #expect(again.headers["etag"] == tag)
                let listed = try await server.request("GET", asset.path, headers: ["If-None-Match": "\"other\", \(tag)"])
                #expect(listed.status == 304, "a list naming the tag")
                let other = try await server.request("GET", asset.path, headers: ["If-None-Match": "\"0123\""])
                #expect(other.status == 200 && other.body == first.body, "\(asset.path) with a stale tag")
            }
            #expect(tags.count == Self.assets.count, "each asset has its own tag")
        }
    }

    @Test("the page refers only to its own assets: no inline script or style, nothing from elsewhere")
    func noInlineCode() async throws {
        try await withLiveServer { server in
            let html = try await server.request("GET", "/").text
            #expect(html.contains(#"<script src="/dashboard.js""#))
            #expect(html.contains(#"<link rel="stylesheet" href="/dashboard.css">"#))
            #expect(!html.contains("<style"), "inline style is refused by the CSP")
            #expect(!html.contains(" style="), "inline style attributes are refused by the CSP")
            #expect(!html.contains("<script>"), "inline script is refused by the CSP")
            #expect(!html.lowercased().contains(try Regex(#"\son[a-z]+\s*="#)), "no inline event handlers")
            #expect(!html.contains("http://") && !html.contains("https://"), "no external assets")
            let js = try await server.request("GET", "/dashboard.js").text
            #expect(!js.contains("innerHTML") && !js.contains("outerHTML") && !js.contains("insertAdjacentHTML"), "data goes in as text only")
            #expect(!js.contains("eval(") && !js.contains("new Function"), "no eval")
        }
    }

    @Test("the page opens its stream past the last seq to start from now: no replay, then the next event")
    func streamFromNow() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let old = try await server.addDelay("q")
            #expect(try await server.request("GET", "/v1/events?after=0").objects("events").count > 0)
            // What dashboard.js sends as ?after= on its first connection.
            async let stream = server.readEventStream("/v1/events/stream?after=9223372036854775807", count: 1, timeout: 5)
            try await Task.sleep(nanoseconds: 200_000_000)
            let new = try await server.addDelay("q")
            let (head, events) = try await stream
            #expect(head.status == 200)
            let first = try #require(events.first, "an event after the stream opened")
            #expect(first.object["operation"] as? String == new, "the first event is the new one, not a replay of \(old)")
        }
    }

    @Test("GET /v1/access: write without a token configured, write or read by the token presented, 401 without one")
    func access() async throws {
        try await withLiveServer { server in
            let r = try await server.request("GET", "/v1/access")
            #expect(r.status == 200 && r.string("access") == "write", "\(r)")
            #expect(r.mediaType == "application/json")
            expectProblem(try await server.request("GET", "/v1/access?x=1"), 422, mentioning: ["x"])
        }
        try await withLiveServer({
            $0.token = "full-secret"; $0.readToken = "read-secret"
        }) { server in
            let full = try await server.request("GET", "/v1/access", headers: ["Authorization": "Bearer full-secret"])
            #expect(full.status == 200 && full.string("access") == "write", "\(full)")
            let read = try await server.request("GET", "/v1/access", headers: ["Authorization": "Bearer read-secret"])
            #expect(read.status == 200 && read.string("access") == "read", "\(read)")
            let none = try await server.request("GET", "/v1/access")
            expectProblem(none, 401)
            #expect(none.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
            expectProblem(try await server.request("GET", "/v1/access", headers: ["Authorization": "Bearer read-secreT"]), 401)
            expectProblem(try await server.request("POST", "/v1/access", headers: ["Authorization": "Bearer read-secret"]), 403)
        }
        try await withLiveServer({ $0.token = "only-full" }) { server in
            let full = try await server.request("GET", "/v1/access", headers: ["Authorization": "Bearer only-full"])
            #expect(full.string("access") == "write", "\(full)")
            expectProblem(try await server.request("GET", "/v1/access", headers: ["Authorization": "Bearer other"]), 401)
        }
    }
}
