import Dispatch
import Locking
import Testing

@testable import MicroHTTP

/// The server's one error path: a thrown `ProblemConvertible` is answered with its problem,
/// anything else with 500 `internal-error`; the observer sees each answer's route and status as
/// it leaves.
@Suite("Problems and the response observer")
struct ProblemTests {
    struct Refusal: ProblemConvertible {
        var problem: Problem { Problem(409, "custom-conflict", "Conflict", "refused by the handler") }
    }
    struct Bug: Error {}

    @Test("thrown errors become their problem or 500; observed answers carry the handler's route")
    func thrownErrorsAndRoutes() throws {
        let seen = Lock<[String]>([])
        let configuration = HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2, maxBodyBytes: 100, connectionTimeout: 30)
        let server = HTTPServer(
            configuration: configuration,
            handler: { request in
                switch request.path {
                case "/refuse": throw Refusal()
                case "/bug": throw Bug()
                case "/later":
                    return .routed(
                        "GET /later",
                        .deferred { responder in
                            DispatchQueue.global().asyncAfter(deadline: .now() + 0.05) { responder.respond(HTTPResponse(status: 202)) }
                        })
                default: return .routed("GET /ok", .response(HTTPResponse(status: 200)))
                }
            }, responseObserver: { route, status, _ in seen.withLock { $0.append("\(route ?? "nil") \(status)") } })
        try server.start()
        defer { server.shutdown(timeout: .seconds(2)) }
        let socket = try RawConnection(port: server.port)
        let refused = try socket.request("GET", "/refuse")
        #expect(refused.status == 409)
        #expect(refused.headers["content-type"] == "application/problem+json")
        #expect(refused.text.contains(#""type":"https://opqd.dev/problems/custom-conflict""#), "\(refused.text)")
        let bug = try socket.request("GET", "/bug")
        #expect(bug.status == 500)
        #expect(bug.text.contains("/problems/internal-error"))
        #expect(try socket.request("GET", "/later").status == 202)
        #expect(try socket.request("GET", "/ok").status == 200)
        let big = try RawConnection(port: server.port).request("POST", "/ok", body: Array(repeating: 0x61, count: 500))
        #expect(big.status == 413)
        #expect(big.text.contains("/problems/payload-too-large"))
        #expect(waitUntil { seen.withLock { $0.count } == 5 })
        #expect(seen.withLock { $0 } == ["nil 409", "nil 500", "GET /later 202", "GET /ok 200", "nil 413"])
    }
}
