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
/// queues each owns, as the placement sees them (`ClusterView`). With SQLite (or memory) one
/// opqd serves the store alone: `mode` says `single` and the cluster is this instance.
package struct ClusterController: Sendable {
    let engine: QueueEngine
    let placement: any QueuePlacement

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/cluster", scope: .instance) { req, _ in try cluster(req) }
        // Requests one instance of a cluster sends another together; a partitioned instance's
        // front answers it (`ClusterFront.relay`) before this table is asked.
        r.add("POST", "/v1/cluster/relay", scope: .instance) { _, _ in
            throw Problem(
                409, "not-a-cluster", "Conflict",
                "this instance relays no requests: /v1/cluster/relay carries requests between the instances of a partitioned cluster")
        }
    }

    func cluster(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        return .response(json(200, try placement.clusterView(ownQueues: engine.queues().map(\.name).sorted()).json))
    }
}
