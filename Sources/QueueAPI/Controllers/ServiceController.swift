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
    /// In a cluster, the placement's own families (`opqd_cluster_owner`, its epoch or partitions).
    var clusterMetrics: @Sendable (inout Exposition) -> Void = { _ in }

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/healthz", scope: .instance, access: .open) { _, _ in .response(json(200, Array(#"{"status":"ok"}"#.utf8))) }
        r.add("GET", "/readyz", scope: .instance, access: .open) { _, _ in readyz() }
        r.add("GET", "/metrics", scope: .instance) { _, _ in
            .response(
                HTTPResponse(
                    status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                    body: metrics.render(
                        engine: engine, events: events, webhooks: webhooks.metrics(), store: store.storeStats, cluster: clusterMetrics)))
        }
        r.add("GET", "/openapi.yaml", scope: .instance) { _, _ in
            .response(HTTPResponse(status: 200, headers: [("Content-Type", "application/yaml")], body: Array(openAPIDocument.utf8)))
        }
    }

    func readyz() -> HTTPHandlerResult {
        if lifecycle.isStopping {
            return .response(Problem.notReady("the server is shutting down").response)
        }
        if let problem = store.unavailable {
            return .response(Problem.notReady(problem).response)
        }
        return .response(json(200, Array("{\"status\":\"ready\",\"store\":\"\(store.name)\"}".utf8)))
    }
}
