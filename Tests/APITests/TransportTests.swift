import Foundation
import QueueTesting
import Testing

@Suite("Transport edge cases")
struct TransportTests {
    @Test("a 20 MiB body gets 413, creates nothing, and the server still answers")
    func oversizedBody() async throws {
        try await withLiveServer { server in
            let fixture = try await Fixture.make(server)
            let before = try await server.fingerprint()
            let (r, sent) = try await server.oversizedRequest("POST", "/v1/queues/q/operations", size: 20 << 20)
            expectProblem(r, 413)
            #expect(sent < 20 << 20, "the server read all \(sent) bytes before refusing")
            #expect(try await server.request("GET", "/healthz").status == 200)
            #expect(try await server.fingerprint() == before)
            // And it still takes work.
            _ = try await server.addDelay("idle", seconds: 0)
            _ = fixture
        }
    }

    @Test("a body just over a configured limit gets 413; one at the limit is read")
    func configuredLimit() async throws {
        try await withLiveServer({ $0.maxBody = 4096 }) { server in
            let name = String(repeating: "n", count: 20)
            let exact = #"{"name":"\#(name)"}"#
            let padded = exact + String(repeating: " ", count: 4096 - exact.utf8.count)
            #expect(try await server.request("POST", "/v1/queues", json: padded).status == 201)
            let over = try await server.request("POST", "/v1/queues", json: #"{"name":"other"}"# + String(repeating: " ", count: 4096))
            expectProblem(over, 413)
            #expect(try await server.queueNames() == [name])
        }
    }

    @Test("a slow client whose headers trickle in over a second still gets its answer")
    func slowClient() async throws {
        try await withLiveServer { server in
            let start = Date()
            let slow = Task { () throws -> (TestResponse, Date) in
                let r = try await server.slowRequest("POST", "/v1/queues", json: #"{"name":"slowpoke"}"#, over: 1.0)
                return (r, Date())
            }
            // Meanwhile others are served: a request sent later is answered first.
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(try await server.request("GET", "/healthz").status == 200)
            let quickEnd = Date()
            let (r, slowEnd) = try await slow.value
            #expect(quickEnd < slowEnd, "others wait for the slow client")
            #expect(elapsed(since: start) >= 0.9)
            #expect(r.status == 201, "\(r)")
            #expect(r.string("name") == "slowpoke")
            #expect(try await server.queueNames() == ["slowpoke"])
        }
    }

    @Test("a connection dropped mid-body creates nothing and the server still answers")
    func droppedMidBody() async throws {
        try await withLiveServer { server in
            _ = try await Fixture.make(server)
            let before = try await server.fingerprint()
            let full = Array(#"{"name":"half-made","maxConcurrentOperationCount":2}"#.utf8)
            try await server.dropMidBody("POST", "/v1/queues", declaredLength: full.count, sending: Array(full[..<20]))
            let op = Array(#"{"kind":"delay","spec":{"seconds":0.05}}"#.utf8)
            try await server.dropMidBody("POST", "/v1/queues/q/operations", declaredLength: op.count, sending: Array(op[..<10]))
            try await server.dropMidBody("POST", "/v1/queues/q/operations", declaredLength: 1 << 19, sending: [])
            #expect(try await server.request("GET", "/healthz").status == 200)
            try await Task.sleep(nanoseconds: 100_000_000)
            #expect(try await server.fingerprint() == before)
            #expect(try await server.request("GET", "/v1/queues/half-made").status == 404)
        }
    }
}
