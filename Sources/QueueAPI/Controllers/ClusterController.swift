import Locking
import MicroHTTP
import QueueEngine

/// Who this instance is, for `GET /v1/cluster`: its id (kept in the store), the URL others
/// reach it by (`--advertise`, else its bound address, known once it listens), when it
/// started and its last heartbeat (the service's once-a-second timer).
package final class InstanceInfo: Sendable {
    let id: String
    let store: String
    let startedAt: Timestamp
    private let state = Lock<(url: String, heartbeatAt: Timestamp)>(("", Timestamp(nanoseconds: 0)))

    package init(id: String, store: String, now: Timestamp) {
        self.id = id
        self.store = store
        self.startedAt = now
        state.withLock { $0.heartbeatAt = now }
    }

    package var url: String { state.withLock { $0.url } }
    var heartbeatAt: Timestamp { state.withLock { $0.heartbeatAt } }
    package func listening(at url: String) { state.withLock { $0.url = url } }
    package func beat(_ now: Timestamp) { state.withLock { $0.heartbeatAt = now } }
}

/// `GET /v1/cluster`: the instances serving this API, with their URL, heartbeat and the
/// queues each owns. With SQLite (or memory) one opqd serves the store alone: `mode` says
/// `single` and the cluster is this instance. With PostgreSQL (`directory`), the instances
/// as the database lists them, the owner with its epoch and every queue (`mode: cluster`).
package struct ClusterController: Sendable {
    let engine: QueueEngine
    let instance: InstanceInfo
    let directory: ClusterDirectory?
    var partitions: PartitionOwner? = nil

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/cluster", scope: .instance) { req, _ in try cluster(req) }
    }

    func cluster(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let queues = engine.queues().map(\.name).sorted()
        let view: ClusterView
        if let directory {
            view = try directory.clusterView(ownQueues: queues)
        } else if let partitions {
            view = try partitions.clusterView()
        } else {
            view = ClusterView(
                mode: "single", store: instance.store,
                instances: [
                    ClusterView.Instance(
                        id: instance.id, url: instance.url, isSelf: true, startedAt: instance.startedAt, heartbeatAt: instance.heartbeatAt,
                        queues: queues)
                ])
        }
        return .response(json(200, view.json))
    }
}
