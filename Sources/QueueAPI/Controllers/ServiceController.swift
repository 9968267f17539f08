import MicroHTTP
import QueueEngine
import StoreKit
import Synchronization

/// Set when shutdown begins; readiness reads it.
package final class Lifecycle: Sendable {
    package let stopping = Atomic<Bool>(false)
    package init() {}
    package var isStopping: Bool { stopping.load(ordering: .relaxed) }
}

/// Liveness, readiness, `/metrics` and the served OpenAPI document.
package struct ServiceController: Sendable {
    let engine: QueueEngine
    let events: EventLog
    let metrics: Metrics
    let webhooks: Webhooks
    let store: any DurableStore
    let lifecycle: Lifecycle
    /// Where the queues live: its readiness, and its own `/metrics` families (`opqd_cluster_owner`,
    /// its epoch or partitions).
    let placement: any QueuePlacement

    package func addRoutes(to r: inout Router) {
        let (store, placement) = (self.store, self.placement)
        Self.addProbes(to: &r, lifecycle: lifecycle, store: store.name) { store.unavailable ?? placement.unready }
        r.add("GET", "/metrics", scope: .instance) { _, _ in
            .response(
                HTTPResponse(
                    status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                    body: metrics.render(
                        engine: engine, events: events, webhooks: webhooks.metrics(), store: store.storeStats,
                        cluster: { out in placement.writeMetrics(to: &out) })))
        }
        r.add("GET", "/openapi.yaml", scope: .instance) { _, _ in
            .response(HTTPResponse(status: 200, headers: [("Content-Type", "application/yaml")], body: Array(openAPIDocument.utf8)))
        }
    }

    /// `/healthz` (alive: always 200) and `/readyz` (503 `not-ready` while stopping, or while
    /// `unready` says why not; else 200 naming the store), for every kind of instance (an owner,
    /// a follower).
    package static func addProbes(
        to r: inout Router, lifecycle: Lifecycle, store: String, unready: @escaping @Sendable () -> String?
    ) {
        r.add("GET", "/healthz", scope: .instance, access: .open) { _, _ in .response(json(200, Array(#"{"status":"ok"}"#.utf8))) }
        r.add("GET", "/readyz", scope: .instance, access: .open) { _, _ in
            if lifecycle.isStopping { return .response(Problem.notReady("the server is shutting down").response) }
            if let why = unready() { return .response(Problem.notReady(why).response) }
            return .response(json(200, Array("{\"status\":\"ready\",\"store\":\"\(store)\"}".utf8)))
        }
    }
}
