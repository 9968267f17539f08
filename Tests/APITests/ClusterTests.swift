import Foundation
import QueueTesting
import Testing

/// `GET /v1/cluster`: who serves this API. One instance for now (queue ownership on
/// PostgreSQL is issue 13's next step), owning every queue.
@Suite("The cluster view")
struct ClusterTests {
    @Test("GET /v1/cluster shows this instance: its id, URL, heartbeat and every queue; the read token is enough")
    func singleInstance() async throws {
        try await withLiveServer({
            $0.token = "w-token"; $0.readToken = "r-token"
        }) { server in
            let write = ["Authorization": "Bearer w-token"]
            for name in ["b", "a"] {
                _ = try await server.request("POST", "/v1/queues", json: "{\"name\":\"\(name)\"}", headers: write).expecting(201)
            }
            let r = try await server.request("GET", "/v1/cluster", headers: ["Authorization": "Bearer r-token"]).expecting(200).validJSON()
            #expect(r.string("mode") == "single")
            #expect(r.string("store") == "sqlite")
            let instances = r.objects("instances")
            try #require(instances.count == 1, "\(r.text)")
            let me = instances[0]
            #expect(me["self"] as? Bool == true)
            #expect(me["url"] as? String == "http://127.0.0.1:\(server.port)")
            #expect(me["queues"] as? [String] == ["a", "b"])
            #expect((me["id"] as? String)?.isEmpty == false)
            let beat = try #require(parseTime(me["heartbeatAt"]))
            #expect(abs(beat.timeIntervalSinceNow) < 5, "heartbeat \(beat)")
            #expect(parseTime(me["startedAt"]) != nil)
            // The same id as the archives' exportedFrom.
            let archive = try await server.request("GET", "/v1/queues/a/archive", headers: write).expecting(200)
            #expect(archive.string("exportedFrom") == me["id"] as? String)
            expectProblem(try await server.request("GET", "/v1/cluster", headers: ["Authorization": "Bearer nope"]), 401)
            expectProblem(try await server.request("GET", "/v1/cluster?x=1", headers: write), 422, mentioning: ["x"])
        }
    }

    @Test("--advertise is the URL shown, and a heartbeat moves")
    func advertise() async throws {
        try await withLiveServer({ $0.advertise = "http://opqd-1.internal:8080" }) { server in
            let first = try await server.request("GET", "/v1/cluster").expecting(200).objects("instances").first ?? [:]
            #expect(first["url"] as? String == "http://opqd-1.internal:8080")
            let t0 = try #require(parseTime(first["heartbeatAt"]))
            #expect(
                try await eventually(timeout: 5, every: 0.1) {
                    let again = try await server.request("GET", "/v1/cluster").expecting(200).objects("instances").first ?? [:]
                    return (parseTime(again["heartbeatAt"]) ?? t0) > t0
                })
        }
    }
}
