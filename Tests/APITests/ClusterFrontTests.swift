import Locking
import MicroHTTP
import QueueEngine
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// A test placement: only what a `ClusterFront` asks (`serves`, `holder`, `selfID`, `selfURL`)
/// is its own; the rest is answered here.
protocol FrontTestPlacement: QueuePlacement {}

extension FrontTestPlacement {
    var servesEveryQueue: Bool { false }
    var startsAfterCommit: Bool { true }
    func mayStart() -> Bool { true }
    var unready: String? { nil }
    func clusterView(ownQueues: [String]) throws -> ClusterView { ClusterView(mode: "cluster", store: "postgres", instances: []) }
    func writeMetrics(to out: inout Exposition) {}
    func onChange(_ body: @escaping @Sendable (PlacementChange) -> Void) {}
    func start(engine: QueueEngine, advertise: String) throws {}
    func stop() {}
    func abandon() {}
}

/// A placement as a table: this instance is "a" (`http://a:1`); each queue's holder by id,
/// served here when held by "a". A queue not in the table is held by nobody (moving).
struct FakePlacement: FrontTestPlacement {
    let selfID = "a"
    let selfURL = "http://a:1"
    var served: Set<String> = []
    var holders: [String: PlacementHolder] = [:]

    init(_ held: [String: String]) {
        for (queue, instance) in held {
            if instance == selfID { served.insert(queue) }
            holders[queue] = PlacementHolder(instance: instance, url: "http://\(instance):1")
        }
    }

    func serves(queue name: String) -> Bool { served.contains(name) }
    func holder(ofQueue name: String) -> PlacementHolder? { holders[name] }
}

/// Where `ClusterFront` sends each request, over the real route table and a fake placement:
/// no PostgreSQL, no other instance.
@Suite("Where a cluster answers a request (ClusterFront over the route table)")
struct ClusterFrontTests {
    /// "here" is served here; "b1" and "b2" are held by b, "c1" by c; "moving" by nobody;
    /// "adopting" is held by this instance but not served yet; "hidden" by d, whose URL is
    /// not known yet.
    static var placement: FakePlacement {
        var p = FakePlacement(["here": "a", "b1": "b", "b2": "b", "c1": "c", "adopting": "a", "hidden": "d"])
        p.served.remove("adopting")
        p.holders["hidden"]?.url = ""
        return p
    }

    /// Operations as PostgreSQL knows them (not in this instance's engine).
    static let op = (here: "op-0000000000000001", b1: "op-0000000000000002", c1: "op-0000000000000003", moving: "op-0000000000000004")
    static let unknown = "op-00000000000000ff"
    static let stored: [UInt64: String] = [1: "here", 2: "b1", 3: "c1", 4: "moving"]

    /// The front, with `reads` counting PostgreSQL reads of operations' queues.
    static func front(
        _ placement: FakePlacement = placement, engine: QueueEngine? = nil, token: String? = nil, storeDown: Bool = false,
        reads: Locking.Lock<Int> = Locking.Lock(0)
    ) -> ClusterFront {
        let access = Access(token: token, readToken: token.map { $0 + "-read" })
        let queues = OperationQueues(
            read: { id in
                reads.withLock { $0 += 1 }
                if storeDown { throw Down() }
                return stored[id.raw]
            },
            readMany: { ids in
                reads.withLock { $0 += 1 }
                if storeDown { throw Down() }
                var found: [OperationID: String] = [:]
                for id in ids { if let q = stored[id.raw] { found[id] = q } }
                return found
            })
        return ClusterFront(
            placement: placement, router: RouteTables.api(token: token),
            engine: engine ?? QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore()),
            forwarder: Forwarder(selfID: placement.selfID, maxResponseBytes: 1 << 20, maxWaitSeconds: 300), access: access, queues: queues,
            reads: APIDispatcher(router: RouteTables.followerReads(), access: access) { _, _ in })
    }

    static func request(_ line: String, _ body: String = "", headers: [String: String] = [:]) -> HTTPRequest {
        let parts = line.split(separator: " ", maxSplits: 1).map(String.init)
        return HTTPRequest(method: parts[0], path: parts.count > 1 ? parts[1] : "/", headers: headers, body: Array(body.utf8))
    }

    /// A decision in words.
    static func summary(_ decision: ClusterFront.Decision) -> String {
        switch decision {
        case .local, .served: return "local"
        case .storeRead: return "store read"
        case .gather: return "gather"
        case let .forward(url, _): return "forward \(url)"
        case let .split(list, member, elements, parts):
            return "split \(list)[].\(member) of \(elements.count): " + parts.map { "\($0.url) \($0.indices)" }.joined(separator: ", ")
        case let .noOwner(queue): return "503 no-owner \(queue)"
        case let .spansInstances(_, queues): return "409 spans-instances \(queues.joined(separator: ","))"
        case .across: return "decided across instances"
        case let .storeUnavailable(detail): return "503 store-unavailable \(detail)"
        case let .refused(problem): return "refused \(problem.status)"
        }
    }

    static func finish(_ ids: String...) -> String {
        #"{"finishes":["# + ids.map { #"{"id":"\#($0)","leaseToken":"t","result":1}"# }.joined(separator: ",") + "]}"
    }

    static func batch(_ queues: String...) -> String {
        #"{"operations":["# + queues.map { #"{"queue":"\#($0)","kind":"immediate"}"# }.joined(separator: ",") + "]}"
    }

    /// (request line, body, what becomes of it).
    static let cases: [(String, String, String)] = [
        // Nothing queue-scoped, or nothing a route matches: here.
        ("GET /healthz", "", "local"),
        ("GET /v1/workers", "", "gather"),
        ("GET /v1/events", "", "local"),
        ("GET /v1/cluster", "", "local"),
        ("GET /nothing", "", "local"),
        ("PUT /v1/queues/b1", "", "local"),
        ("GET /v1/queues/b1/nothing", "", "local"),
        ("GET /v1/operations/\(op.b1)/nothing", "", "local"),
        // A queue from the path.
        ("GET /v1/queues", "", "store read"),
        ("GET /v1/queues/here", "", "local"),
        ("GET /v1/queues/b1", "", "store read"),
        ("HEAD /v1/queues/b1", "", "store read"),
        ("GET /v1/queues/moving", "", "store read"),
        ("PATCH /v1/queues/b1", "{}", "forward http://b:1"),
        ("GET /v1/queues/b1/operations", "", "forward http://b:1"),
        ("POST /v1/queues/c1/operations", #"{"kind":"immediate"}"#, "forward http://c:1"),
        ("POST /v1/queues/here/operations", #"{"kind":"immediate"}"#, "local"),
        ("POST /v1/queues/moving/operations", #"{"kind":"immediate"}"#, "503 no-owner moving"),
        ("POST /v1/queues/adopting/suspend", "", "503 no-owner adopting"),
        ("POST /v1/queues/hidden/suspend", "", "503 no-owner hidden"),
        ("DELETE /v1/queues/c1/observers/w", "", "forward http://c:1"),
        ("GET /v1/queues/b2/archive", "", "forward http://b:1"),
        ("POST /v1/queues/b2/claim", "{}", "forward http://b:1"),
        // A queue from the body.
        ("POST /v1/queues", #"{"name":"b1"}"#, "forward http://b:1"),
        ("POST /v1/queues", #"{"name":"here"}"#, "local"),
        ("POST /v1/queues", #"{"name":"moving"}"#, "503 no-owner moving"),
        ("POST /v1/queues", #"{"name":7}"#, "local"),
        ("POST /v1/queues", "not json", "local"),
        // An operation's queue.
        ("GET /v1/operations/\(op.here)", "", "local"),
        ("GET /v1/operations/\(op.b1)", "", "store read"),
        ("GET /v1/operations/\(op.b1)/events", "", "store read"),
        ("GET /v1/operations/\(op.moving)", "", "store read"),
        ("GET /v1/operations/\(op.b1)/wait", "", "forward http://b:1"),
        ("POST /v1/operations/\(op.b1)/cancel", "", "forward http://b:1"),
        ("POST /v1/operations/\(op.c1)/heartbeat", "{}", "forward http://c:1"),
        ("GET /v1/operations/\(op.c1)/observers", "", "forward http://c:1"),
        ("POST /v1/operations/\(op.moving)/cancel", "", "503 no-owner moving"),
        ("POST /v1/operations/\(unknown)/cancel", "", "local"),
        ("POST /v1/operations/op-nothex/cancel", "", "local"),
        // A copy: made by the holder of the queue it goes into.
        ("POST /v1/operations/\(op.here)/copy", #"{"queue":"c1"}"#, "forward http://c:1"),
        ("POST /v1/operations/\(op.b1)/copy", #"{"queue":"b2"}"#, "forward http://b:1"),
        ("POST /v1/operations/\(op.b1)/copy", #"{"queue":"here"}"#, "local"),
        ("POST /v1/operations/\(op.here)/copy", #"{"queue":"moving"}"#, "503 no-owner moving"),
        ("POST /v1/operations/\(op.here)/copy", "{}", "local"),
        ("POST /v1/operations/\(op.b1)/copy", "{}", "forward http://b:1"),
        // A batch: one instance's queues, or refused.
        ("POST /v1/operations:batch", batch("here", "here"), "local"),
        ("POST /v1/operations:batch", batch("b1", "b2"), "forward http://b:1"),
        ("POST /v1/operations:batch", batch("b1", "c1"), "409 spans-instances b1,c1"),
        ("POST /v1/operations:batch", batch("here", "b1"), "409 spans-instances b1,here"),
        ("POST /v1/operations:batch", batch("b1", "moving"), "503 no-owner moving"),
        ("POST /v1/operations:batch", #"{"operations":[]}"#, "local"),
        ("POST /v1/operations:batch", "[]", "local"),
        // Finishes: split among the holders of their operations' queues.
        ("POST /v1/operations:finish", finish(op.here), "local"),
        ("POST /v1/operations:finish", finish(op.b1, op.b1), "forward http://b:1"),
        ("POST /v1/operations:finish", finish(op.here, op.b1), "split finishes[].id of 2: http://a:1 [0], http://b:1 [1]"),
        ("POST /v1/operations:finish", finish(op.b1, op.c1, unknown), "split finishes[].id of 3: http://b:1 [0, 2], http://c:1 [1]"),
        ("POST /v1/operations:finish", finish(unknown, op.c1, op.here), "split finishes[].id of 3: http://a:1 [0, 2], http://c:1 [1]"),
        ("POST /v1/operations:finish", finish(op.b1, op.moving), "503 no-owner moving"),
        ("POST /v1/operations:finish", #"{"finishes":[{"id":"\#(op.b1)"}]}"#, "local"),
        ("POST /v1/operations:finish", #"{"finishes":"no"}"#, "local"),
    ]

    @Test(arguments: cases)
    func aRequestGoesWhereItsRouteAndThePlacementSay(_ line: String, _ body: String, _ expected: String) {
        #expect(Self.summary(Self.front().decide(Self.request(line, body))) == expected, "\(line) \(body)")
    }

    /// A request forwarded here for a queue this instance does not serve goes once more, also
    /// back to its sender when that holds it now (the queue moved there on the way: a
    /// handover); finishes forwarded whole are shared out here if their queues are now on
    /// several instances, and a share of a split is never split again.
    @Test(arguments: [
        ("PATCH /v1/queues/b1", "{}", "forward http://b:1"),
        ("POST /v1/operations/\(op.b1)/cancel", "", "forward http://b:1"),
        ("POST /v1/operations:batch", batch("b1", "b2"), "forward http://b:1"),
        ("POST /v1/operations:finish", finish(op.b1, op.b1), "forward http://b:1"),
        ("POST /v1/operations:finish", finish(op.here, op.b1), "split finishes[].id of 2: http://a:1 [0], http://b:1 [1]"),
        ("POST /v1/operations:finish", finish(op.b1, op.c1), "split finishes[].id of 2: http://b:1 [0], http://c:1 [1]"),
        // What this instance answers itself it still answers.
        ("PATCH /v1/queues/here", "{}", "local"),
        ("GET /v1/queues/b1", "", "store read"),
        // Another instance's gathering asks for this instance's own part.
        ("GET /v1/workers", "", "local"),
    ])
    func aForwardedRequestIsNeverForwardedAgain(_ line: String, _ body: String, _ expected: String) {
        let request = Self.request(line, body, headers: [Forwarder.header: "b"])
        #expect(Self.summary(Self.front().decide(request)) == expected, "\(line) \(body)")
    }

    /// A share of finishes split by another instance: sent on once more when one other
    /// instance holds all of its queues now (a handover while it was on its way), never split
    /// again; and no request is split or sent on a third time.
    @Test(
        arguments: [
            (finish(op.b1, op.b1), "1", true, "forward http://b:1"),
            (finish(op.here, op.b1), "1", true, "503 no-owner b1"),
            (finish(op.b1, op.c1), "1", true, "503 no-owner b1"),
            (finish(op.b1, op.c1), "2", false, "503 no-owner b1"),
            (finish(op.b1), "2", false, "503 no-owner b1"),
        ] as [(String, String, Bool, String)])
    func aShareOfFinishesIsNeverSplitAgain(_ body: String, _ hops: String, _ share: Bool, _ expected: String) {
        var headers = [Forwarder.header: "c", Forwarder.hopsHeader: hops]
        if share { headers[ClusterFront.splitPartHeader] = "1" }
        #expect(Self.summary(Self.front().decide(Self.request("POST /v1/operations:finish", body, headers: headers))) == expected, "\(body) \(headers)")
        // A client's own copy of the field changes nothing.
        #expect(
            Self.summary(
                Self.front().decide(
                    Self.request("POST /v1/operations:finish", Self.finish(Self.op.here, Self.op.b1), headers: [ClusterFront.splitPartHeader: "1"])))
                == "split finishes[].id of 2: http://a:1 [0], http://b:1 [1]")
    }

    /// A queue that moved on while its request was on its way (a handover): the request goes
    /// once more, to the new holder (its sender too), but not a third time.
    @Test(
        arguments: [
            ("PATCH /v1/queues/c1", "{}", "b", nil, "forward http://c:1"),
            ("PATCH /v1/queues/c1", "{}", "b", "1", "forward http://c:1"),
            ("PATCH /v1/queues/c1", "{}", "b", "2", "503 no-owner c1"),
            ("PATCH /v1/queues/c1", "{}", "c", nil, "forward http://c:1"),
            ("PATCH /v1/queues/c1", "{}", "b", "junk", "forward http://c:1"),
        ] as [(String, String, String, String?, String)])
    func aForwardedRequestGoesOnceMoreToANewHolder(_ line: String, _ body: String, _ sender: String, _ hops: String?, _ expected: String) {
        var headers = [Forwarder.header: sender]
        if let hops { headers[Forwarder.hopsHeader] = hops }
        #expect(Self.summary(Self.front().decide(Self.request(line, body, headers: headers))) == expected, "\(line) from \(sender), hops \(hops ?? "-")")
    }

    @Test func operationsInThisInstancesEngineAreRoutedWithoutReadingPostgreSQL() throws {
        let engine = QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore())
        _ = try engine.createQueue(name: "here", isSuspended: true)
        _ = try engine.createQueue(name: "b1", isSuspended: true)
        let mine = try engine.addOperation(to: "here", OperationRequest(kind: "immediate")).id
        let leaving = try engine.addOperation(to: "b1", OperationRequest(kind: "immediate")).id
        let reads = Locking.Lock(0)
        let front = Self.front(engine: engine, reads: reads)
        #expect(Self.summary(front.decide(Self.request("POST /v1/operations/\(mine)/cancel"))) == "local")
        // Its queue was given up (no longer served) before the engine let it go: to its holder.
        #expect(Self.summary(front.decide(Self.request("POST /v1/operations/\(leaving)/cancel"))) == "forward http://b:1")
        #expect(
            Self.summary(front.decide(Self.request("POST /v1/operations:finish", Self.finish("\(mine)", "\(leaving)"))))
                == "split finishes[].id of 2: http://a:1 [0], http://b:1 [1]")
        #expect(reads.withLock { $0 } == 0)
    }

    /// Served here, not merely local: it runs inside the placement's gate, so a handover
    /// cannot take its queues out of the engine under it (`runServed`).
    @Test func aFinishOfOperationsAllServedHereIsServedHere() {
        guard case let .served(queues) = Self.front().decide(Self.request("POST /v1/operations:finish", Self.finish(Self.op.here, Self.op.here))) else {
            Issue.record("not decided served here")
            return
        }
        #expect(queues == ["here"])
    }

    @Test func anOperationWhoseQueueCannotBeReadIs503() {
        let front = Self.front(storeDown: true)
        #expect(Self.summary(front.decide(Self.request("POST /v1/operations/\(Self.op.b1)/cancel"))) == "503 store-unavailable down")
        #expect(Self.summary(front.decide(Self.request("POST /v1/operations:finish", Self.finish(Self.op.b1)))) == "503 store-unavailable down")
    }

    /// The token rules of the route's method come first: nothing is relayed, split or read
    /// from PostgreSQL for a caller without the token.
    @Test func aCallerWithoutTheTokenIsRefusedBeforeAnythingIsReadOrRelayed() {
        let reads = Locking.Lock(0)
        let front = Self.front(token: "secret", reads: reads)
        let read = ["authorization": "Bearer secret-read"]
        #expect(Self.summary(front.decide(Self.request("PATCH /v1/queues/b1", "{}"))) == "refused 401")
        #expect(Self.summary(front.decide(Self.request("POST /v1/queues/moving/suspend"))) == "refused 401")
        #expect(Self.summary(front.decide(Self.request("POST /v1/operations:batch", Self.batch("b1", "c1")))) == "refused 401")
        #expect(Self.summary(front.decide(Self.request("GET /v1/operations/\(Self.op.b1)"))) == "refused 401")
        #expect(Self.summary(front.decide(Self.request("POST /v1/operations:finish", Self.finish(Self.op.b1)))) == "refused 401")
        #expect(reads.withLock { $0 } == 0, "PostgreSQL was read for a caller without a token")
        #expect(Self.summary(front.decide(Self.request("POST /v1/queues/b1/suspend", headers: read))) == "refused 403")
        #expect(Self.summary(front.decide(Self.request("GET /v1/queues/b1/operations", headers: read))) == "forward http://b:1")
        // Answered here: the dispatcher applies the same rules.
        #expect(Self.summary(front.decide(Self.request("PATCH /v1/queues/here", "{}"))) == "local")
        let full = ["authorization": "Bearer secret"]
        #expect(Self.summary(front.decide(Self.request("PATCH /v1/queues/b1", "{}", headers: full))) == "forward http://b:1")
    }

    /// The answers `route` makes of the refusals, as clients have had them.
    @Test func theRefusalsAreAnsweredAsBefore() throws {
        let front = Self.front()
        let spans = try Self.answer(front.route(Self.request("POST /v1/operations:batch", Self.batch("c1", "b1"))))
        #expect(spans.route == Router.unmatched)
        #expect(spans.response.status == 409)
        let spansBody = String(decoding: spans.response.body, as: UTF8.self)
        #expect(spansBody.contains(#""type":"https://opqd.dev/problems/spans-instances""#), "\(spansBody)")
        #expect(
            spansBody.contains(
                "the batch's queues (b1, c1) are owned by different instances of the cluster; one request can change the queues of one instance only: split it by queue"
            ), "\(spansBody)")
        let moving = try Self.answer(front.route(Self.request("POST /v1/queues/moving/suspend")))
        #expect(moving.route == Router.unmatched)
        #expect(moving.response.status == 503)
        #expect(moving.response.headers.contains { $0.0 == "Retry-After" && $0.1 == "1" })
        let movingBody = String(decoding: moving.response.body, as: UTF8.self)
        #expect(movingBody.contains(#""type":"https://opqd.dev/problems/no-owner""#), "\(movingBody)")
        #expect(
            movingBody.contains(
                "no instance serves queue 'moving' right now (its partition is moving); retry shortly, with an Idempotency-Key for changes"),
            "\(movingBody)")
        let down = try Self.answer(Self.front(storeDown: true).route(Self.request("POST /v1/operations/\(Self.op.b1)/cancel")))
        #expect(down.response.status == 503)
        #expect(String(decoding: down.response.body, as: UTF8.self).contains(#""type":"https://opqd.dev/problems/store-unavailable""#))
        #expect(front.route(Self.request("PATCH /v1/queues/here", "{}")) == nil)
    }

    /// The label and response of an answer made now.
    static func answer(_ result: HTTPHandlerResult?) throws -> (route: String, response: HTTPResponse) {
        guard case let .routed(route, .response(response))? = result else { throw Unanswered() }
        return (route, response)
    }

    struct Unanswered: Error {}

    struct Down: Error, CustomStringConvertible {
        var description: String { "down" }
    }
}
