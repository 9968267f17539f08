import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// API.md "Who may call": with `--token T --read-token R`, every route needs a token; R may only
/// read; the decision is made on the matched route, never a prefix of the raw path.
@Suite("Authentication cannot be bypassed")
struct AuthTests {
    static let write = "write-token-0123456789abcdef"
    static let read = "read-token-fedcba9876543210"

    /// A server with both tokens, a suspended queue `aq`, one operation in it and (if the
    /// server has them) an operation observer. Returns the ids.
    static func setUp() throws -> (Opqd, id: String, observer: String) {
        let server = try Opqd(["--token", write, "--read-token", read])
        _ = try server.request("POST", "/v1/queues", json: #"{"name":"aq","isSuspended":true}"#, token: write).expecting(
            201, "creating aq with the write token")
        let op = try server.request("POST", "/v1/queues/aq/operations", json: #"{"kind":"delay","spec":{"seconds":30}}"#, token: write).expecting(201)
        let id = op.string("id") ?? "missing"
        let obs = try server.request("POST", "/v1/operations/\(id)/observers", json: #"{"url":"http://127.0.0.1:9/hook"}"#, token: write)
        let observer = obs.string("id") ?? "obs-1"
        return (server, id, observer)
    }

    /// What a client holding the write token sees: every queue, the operation, the feed's
    /// newest seq. Any change an unauthorised request made shows up here.
    static func snapshot(_ server: Opqd, id: String) throws -> String {
        let queues = try server.request("GET", "/v1/queues", token: write)
        let op = try server.request("GET", "/v1/operations/\(id)", token: write)
        let ops = try server.request("GET", "/v1/queues/aq/operations", token: write)
        let events = try server.request("GET", "/v1/events?after=0&limit=1000", token: write)
        let observers = try server.request("GET", "/v1/operations/\(id)/observers", token: write)
        return [queues, op, ops, events, observers].map { "\($0.status) \($0.text)" }.joined(separator: "\n")
    }

    @Test(
        "every route, the feed, the stream, /metrics, /openapi.yaml and unknown paths answer 401 with WWW-Authenticate: Bearer without a token, and change nothing"
    )
    func everyRouteNeedsAToken() async throws {
        let (server, id, observer) = try Self.setUp()
        try await blocking {
            let before = try Self.snapshot(server, id: id)
            for route in Route.all {
                let target = route.target(name: "aq", id: id, observer: observer)
                for auth in [nil, "Bearer ", "Bearer wrong", "Basic \(Data("x:\(Self.write)".utf8).base64EncodedString())"] as [String?] {
                    var headers: [String: String] = [:]
                    if let auth { headers["Authorization"] = auth }
                    // Limits to give up at (every route answers at once): 10 s, as Opqd.request's.
                    let outcome = server.exchange(
                        route.method, target, json: route.body?.replacingOccurrences(of: "{name}", with: "aq").replacingOccurrences(of: "{id}", with: id),
                        headers: headers, timeout: 10)
                    guard let r = outcome.response else {
                        Issue.record("\(route) with \(auth ?? "no Authorization"): \(outcome)")
                        continue
                    }
                    // Another method on a path whose only route is open (POST /healthz) may be told
                    // 405: that tells nothing GET /healthz does not.
                    let openPath = target == "/healthz" || target == "/readyz"
                    #expect(
                        r.status == 401 || (openPath && r.status == 405),
                        "\(route) (\(target)) with \(auth ?? "no Authorization") should be 401: \(r.status) \(r.text.prefix(200))")
                    if r.status == 401 {
                        #expect(
                            r.headers["www-authenticate"]?.lowercased().hasPrefix("bearer") == true,
                            "\(route): 401 without WWW-Authenticate: Bearer (\(r.headers["www-authenticate"] ?? "none"))")
                        if route.method != "HEAD" { #expect(r.mediaType == "application/problem+json", "\(route): 401 is not problem+json") }
                    }
                }
            }
            // A token in the query string is not a token.
            for target in ["/v1/queues?access_token=\(Self.write)", "/v1/queues?token=\(Self.write)"] {
                let r = try server.request("GET", target)
                #expect(r.status == 401, "GET \(target): \(r.status)")
            }
            #expect(try Self.snapshot(server, id: id) == before, "requests without a valid token changed something")
            server.expectAlive("the unauthenticated sweep")
        }
    }

    @Test("GET /healthz and GET /readyz stay open without a token")
    func healthAndReadinessAreOpen() async throws {
        let server = try Opqd(["--token", Self.write, "--read-token", Self.read])
        try await blocking {
            let health = try server.request("GET", "/healthz")
            let ready = try server.request("GET", "/readyz")
            #expect(health.status == 200, "GET /healthz without a token: \(health)")
            #expect(ready.status == 200, "GET /readyz without a token: \(ready)")
        }
    }

    @Test("the read-only token gets 403 read-only-token on every non-GET/HEAD route and changes nothing")
    func readTokenCannotWrite() async throws {
        let (server, id, observer) = try Self.setUp()
        try await blocking {
            let before = try Self.snapshot(server, id: id)
            for route in Route.all where !route.isRead && !route.path.hasPrefix("/healthz") && !route.path.hasPrefix("/readyz") {
                let target = route.target(name: "aq", id: id, observer: observer)
                let r = try server.request(
                    route.method, target, json: route.body?.replacingOccurrences(of: "{name}", with: "aq").replacingOccurrences(of: "{id}", with: id),
                    token: Self.read, timeout: 10)
                // An unknown path may be 404 and a known path with another method 405 once the
                // caller is authenticated; anything a route would change must be 403.
                if route.path == "/v1/nope" || route.method == "PUT" || route.method == "OPTIONS" {
                    #expect([403, 404, 405].contains(r.status), "\(route) with the read token: \(r.status) \(r.text.prefix(200))")
                } else {
                    expectProblem(r, 403, slug: "read-only-token", "\(route) with the read token")
                }
            }
            #expect(try Self.snapshot(server, id: id) == before, "the read-only token changed something")
            server.expectAlive("the read-token sweep")
        }
    }

    @Test("the read-only token may read every GET route, /metrics, the feed and the stream")
    func readTokenCanRead() async throws {
        let (server, id, observer) = try Self.setUp()
        try await blocking {
            for route in Route.all where route.isRead {
                let target = route.target(name: "aq", id: id, observer: observer)
                if route.path.hasPrefix("/v1/events/stream") {
                    // The stream never ends: its head is enough.
                    let c = try RawConnection(port: server.port, timeout: 10)
                    c.send("GET \(target) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(Self.read)\r\n\r\n")
                    let (status, _) = try c.readHead()
                    c.close()
                    #expect(status == 200, "\(route) with the read token: \(status)")
                    continue
                }
                let outcome = server.exchange(route.method, target, headers: ["Authorization": "Bearer \(Self.read)"], timeout: 10)
                guard let r = outcome.response else { Issue.record("\(route) with the read token: \(outcome)"); continue }
                #expect(r.status != 401 && r.status != 403, "\(route) with the read token: \(r.status) \(r.text.prefix(200))")
                #expect(r.status < 500, "\(route) with the read token: \(r.status)")
            }
            #expect(try server.request("GET", "/metrics", token: Self.read).status == 200)
            #expect(try server.request("GET", "/v1/events?after=0", token: Self.read).status == 200)
        }
    }

    @Test("the write token works on every route")
    func writeTokenWorks() async throws {
        let (server, id, observer) = try Self.setUp()
        try await blocking {
            for route in Route.all where !route.path.hasPrefix("/v1/events/stream") {
                let target = route.target(name: "aq", id: id, observer: observer)
                let r = try server.request(
                    route.method, target, json: route.body?.replacingOccurrences(of: "{name}", with: "aq").replacingOccurrences(of: "{id}", with: id),
                    token: Self.write, timeout: 10)
                #expect(r.status != 401 && r.status != 403, "\(route) with the write token: \(r.status) \(r.text.prefix(200))")
                #expect(r.status < 500, "\(route) with the write token: \(r.status) \(r.text.prefix(200))")
            }
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"by-writer"}"#, token: Self.write).expecting(201)
            server.expectAlive("the write-token sweep")
        }
    }

    @Test("request targets that are not absolute paths answer 400 bad-request-target and create nothing, with and without a token")
    func nonAbsoluteRequestTargets() async throws {
        let (server, id, _) = try Self.setUp()
        try await blocking {
            let before = try Self.snapshot(server, id: id)
            let body = #"{"name":"bypass"}"#
            for target in [
                "x/v1/queues", "*", "http://127.0.0.1/v1/queues", "http://127.0.0.1:\(server.port)/v1/queues",
                "HTTP://127.0.0.1/v1/queues", "https://x/v1/queues", "v1/queues", "healthz/../v1/queues", "?/v1/queues",
                "%2Fv1/queues", "\\v1\\queues",
            ] {
                for token in [nil, Self.write, Self.read] as [String?] {
                    var head =
                        "POST \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                    if let token { head += "Authorization: Bearer \(token)\r\n" }
                    switch server.raw(head + "\r\n" + body, timeout: 5) {
                    case let .success(r):
                        expectProblem(
                            r, 400, slug: "bad-request-target",
                            "POST \(target) with \(token == nil ? "no token" : token == Self.write ? "the write token" : "the read token")")
                    case let .failure(e):
                        // Closing without an answer is a refusal too, but the contract asks for 400.
                        Issue.record("POST \(target): no answer (\(e)); API.md asks for 400")
                    }
                }
            }
            // Absolute paths that only look like others: never routed past authentication.
            for target in [
                "//v1/queues", "/v1//queues", "/./v1/queues", "/healthz/../v1/queues", "/healthz/%2e%2e/v1/queues",
                "/healthz%2f..%2fv1%2fqueues", "/V1/queues", "/v1/queues/", "/v1/queues;x", "/v1/queues#x", "/%76%31/queues",
            ] {
                let r = try server.request("POST", target, json: body)
                #expect(r.status == 400 || r.status == 401, "POST \(target) without a token: \(r.status) \(r.text.prefix(200))")
                let r2 = try server.request("POST", target, json: body, token: Self.read)
                #expect((200..<300).contains(r2.status) == false, "POST \(target) with the read token: \(r2.status)")
            }
            #expect(try Self.snapshot(server, id: id) == before, "a request target trick changed something")
            server.expectAlive("the request-target sweep")
        }
    }

    @Test("tokens of the wrong length, a right prefix, a lowercase scheme, extra spaces or two Authorization headers do not get in")
    func tokenVariants() async throws {
        let (server, id, _) = try Self.setUp()
        let w = Self.write
        try await blocking {
            let before = try Self.snapshot(server, id: id)
            let body = #"{"name":"variant"}"#
            let wrong: [String] = [
                "Bearer \(w.dropLast())", "Bearer \(w)x", "Bearer \(w.prefix(1))", "Bearer \(w)\(w)", "Bearer \(w.uppercased())",
                "Bearer \(Self.read)x", "Bearer", "Bearer  ", "\(w)", "Token \(w)", "Bearer:\(w)",
                "Bearer \(String(repeating: "a", count: 10_000))", "Bearer \(w.dropFirst())", "Bearer \u{00e9}\(w)",
            ]
            for auth in wrong {
                var head =
                    "POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                head += "Authorization: \(auth)\r\n\r\n"
                switch server.raw(head + body, timeout: 5) {
                case let .success(r):
                    #expect(r.status == 401 || r.status == 400, "Authorization \(auth.prefix(60).debugDescription): \(r.status) \(r.text.prefix(200))")
                case let .failure(e):
                    Issue.record("Authorization \(auth.prefix(60).debugDescription): no answer (\(e))")
                }
            }
            // Two Authorization fields combine (RFC 9110 §5.3) into "Bearer a, Bearer b", which is
            // not the token: refused whichever order, also with the read token first.
            for (first, second) in [("Bearer wrong", "Bearer \(w)"), ("Bearer \(w)", "Bearer wrong"), ("Bearer \(Self.read)", "Bearer \(w)")] {
                let head =
                    "POST /v1/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nAuthorization: \(first)\r\nAuthorization: \(second)\r\n\r\n"
                switch server.raw(head + body, timeout: 5) {
                case let .success(r): #expect([400, 401, 403].contains(r.status), "two Authorization headers (\(first) / \(second)): \(r.status)")
                case let .failure(e): Issue.record("two Authorization headers: no answer (\(e))")
                }
            }
            #expect(try Self.snapshot(server, id: id) == before, "a token variant changed something")
            // The scheme is case-insensitive (RFC 9110 §11.1) and spaces around the value are not
            // part of it: accepted or refused, but never an error of the server.
            for auth in ["bearer \(w)", "BEARER \(w)", "Bearer  \(w)", "Bearer \(w) ", "Bearer \t\(w)"] {
                let r = try server.request("GET", "/v1/queues", headers: ["Authorization": auth])
                #expect(r.status == 200 || r.status == 401 || r.status == 400, "Authorization \(auth.debugDescription): \(r.status)")
            }
            server.expectAlive("the token variants")
        }
    }
}
