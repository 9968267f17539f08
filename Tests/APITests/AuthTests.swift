import Foundation
import QueueTesting
import Testing

@Suite("Bearer token")
struct AuthTests {
    @Test("with --token, /v1 requests without the right bearer token get 401 and change nothing")
    func tokenRequired() async throws {
        try await withLiveServer({ $0.token = "s3cret" }) { server in
            let missing = try await server.request("POST", "/v1/queues", json: #"{"name":"q"}"#)
            #expect(missing.status == 401)
            #expect(missing.mediaType == "application/problem+json")
            #expect(missing.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
            let wrong = try await server.request("GET", "/v1/queues", headers: ["Authorization": "Bearer s3cre7"])
            #expect(wrong.status == 401)
            let ok = try await server.request("GET", "/v1/queues", headers: ["Authorization": "Bearer s3cret"])
            #expect(ok.status == 200)
            #expect(ok.objects("queues").isEmpty, "the refused create changed nothing")
            let health = try await server.request("GET", "/healthz")
            #expect(health.status == 200, "liveness stays open for probes")
        }
    }
}
