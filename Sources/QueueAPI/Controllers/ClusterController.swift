import Locking
import MicroHTTP
import QueueEngine

/// Who this instance is, for `GET /v1/cluster`: its id (kept in the store), the URL others
/// reach it by (`--advertise`, else its bound address, known once it listens), when it
/// started and its last heartbeat (the service's once-a-second timer).
final class InstanceInfo: Sendable {
    let id: String
    let store: String
    let startedAt: Timestamp
    private let state = Lock<(url: String, heartbeatAt: Timestamp)>(("", Timestamp(nanoseconds: 0)))

    init(id: String, store: String, now: Timestamp) {
        self.id = id
        self.store = store
        self.startedAt = now
        state.withLock { $0.heartbeatAt = now }
    }

    var url: String { state.withLock { $0.url } }
    var heartbeatAt: Timestamp { state.withLock { $0.heartbeatAt } }
    func listening(at url: String) { state.withLock { $0.url = url } }
    func beat(_ now: Timestamp) { state.withLock { $0.heartbeatAt = now } }
}

/// `GET /v1/cluster`: the instances serving this API, with their URL, heartbeat and the
/// queues each owns. With SQLite (or memory) one opqd serves the store alone: `mode` says
/// `single` and the cluster is this instance. With PostgreSQL (`directory`), the instances
/// as the database lists them, the owner with its epoch and every queue (`mode: cluster`).
struct ClusterController: Sendable {
    let engine: QueueEngine
    let instance: InstanceInfo
    let directory: ClusterDirectory?
    var partitions: PartitionOwner? = nil

    func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/cluster", scope: .instance) { req, _ in try cluster(req) }
    }

    func cluster(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        if let directory { return .response(try directory.render(ownQueues: engine.queues().map(\.name).sorted())) }
        if let partitions { return .response(try partitions.render()) }
        let queues = engine.queues().map(\.name).sorted()
        var o = JSONOut(capacity: 256 + 40 * queues.count)
        o.open()
        o.key("mode"); o.string("single")
        o.key("store"); o.string(instance.store)
        o.key("instances"); o.openArray()
        o.open()
        o.key("id"); o.string(instance.id)
        o.key("url"); o.string(instance.url)
        o.key("self"); o.bool(true)
        o.key("startedAt"); o.time(instance.startedAt)
        o.key("heartbeatAt"); o.time(instance.heartbeatAt)
        o.key("queues"); o.openArray()
        for q in queues { o.string(q) }
        o.closeArray()
        o.close()
        o.closeArray()
        o.close()
        return .response(json(200, o.bytes))
    }
}
