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

    @Test("a queue's operations: 304 while the page is unchanged; a new operation, a progress-free state move, or other parameters give another ETag")
    func operationList() async throws {
        try await withLiveServer { server in
            try await server.createQueue("ol", suspended: true)
            let a = try await server.addDelay("ol", seconds: 0.01, name: "alpha")
            let first = try await server.request("GET", "/v1/queues/ol/operations").expecting(200)
            let etag = try #require(first.headers["ETag"])
            #expect(try await server.request("GET", "/v1/queues/ol/operations", headers: ["If-None-Match": etag]).status == 304)
            // Another filter over the same operations is another listing.
            let filtered = try await server.request("GET", "/v1/queues/ol/operations?namePrefix=al", headers: ["If-None-Match": etag])
            #expect(filtered.status == 200 && filtered.headers["ETag"] != etag)
            _ = try await server.request("POST", "/v1/operations/\(a)/pause").expecting(200)
            let paused = try await server.request("GET", "/v1/queues/ol/operations", headers: ["If-None-Match": etag])
            #expect(paused.status == 200, "pausing an operation in the page changes the listing")
            let etag2 = try #require(paused.headers["ETag"])
            _ = try await server.addDelay("ol", seconds: 0.01)
            let added = try await server.request("GET", "/v1/queues/ol/operations", headers: ["If-None-Match": etag2])
            #expect(added.status == 200 && added.objects("operations").count == 2)
            #expect(try await server.request("GET", "/v1/queues/ol/operations", headers: ["If-None-Match": added.headers["ETag"] ?? ""]).status == 304)
        }
    }
}
