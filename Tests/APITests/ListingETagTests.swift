import Foundation
import QueueTesting
import Testing

/// Listings answer `If-None-Match` with 304 while nothing in them changed, from revisions.
@Suite("ETags on listings")
struct ListingETagTests {
    @Test("GET /v1/queues: 304 while nothing changed; a new queue, a change of settings or an operation's move gives a new ETag")
    func queueList() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a", suspended: true)
            let first = try await server.request("GET", "/v1/queues").expecting(200)
            let etag = try #require(first.headers["ETag"])
            let again = try await server.request("GET", "/v1/queues", headers: ["If-None-Match": etag])
            #expect(again.status == 304 && again.body.isEmpty && again.headers["ETag"] == etag)

            var seen = [etag]
            func changed(_ what: String) async throws {
                let r = try await server.request("GET", "/v1/queues", headers: ["If-None-Match": seen.last ?? ""])
                #expect(r.status == 200, "\(what) must give a new listing")
                let tag = try #require(r.headers["ETag"])
                #expect(!seen.contains(tag), "\(what): a new ETag, not \(tag)")
                seen.append(tag)
            }
            try await server.createQueue("b")
            try await changed("a new queue")
            _ = try await server.request("PATCH", "/v1/queues/a", json: #"{"maxConcurrentOperationCount":3}"#).expecting(200)
            try await changed("a settings change")
            let id = try await server.addDelay("a", seconds: 0.01)
            try await changed("a new operation")
            _ = try await server.request("POST", "/v1/queues/a/resume").expecting(200)
            #expect(try await server.waitForState(id, "finished"))
            try await changed("resume and the operation finishing")
            _ = try await server.request("DELETE", "/v1/queues/b").expecting(204)
            try await changed("a deleted queue")
            #expect(try await server.request("GET", "/v1/queues", headers: ["If-None-Match": seen.last ?? ""]).status == 304)
        }
    }
}
