import Logging
import MicroHTTP
import PostgresStore
import QueueEngine
import QueueKinds
import StoreKit
import Testing

@testable import QueueAPI
@testable import QueueCluster

/// The route tables the application builds, made on a memory store: `buildRouter` as
/// `buildApplication` calls it, and the follower reads a partitioned instance answers from
/// PostgreSQL (its pool connects on the first read only, so none is made here).
enum RouteTables {
    static func api(token: String? = nil) -> Router { api(token: token, store: MemoryStore()).router }

    /// The route table over `store` (durable: changes are answered once committed), and its engine.
    static func api(token: String? = nil, store: any DurableStore) -> (router: Router, engine: QueueEngine) {
        let engine = QueueEngine(kinds: ["immediate": ImmediateKind()], store: store.engineStore)
        let events = EventLog(capacity: 16)
        let webhooks = Webhooks(
            logger: Logger(label: "route-tables"), transport: OutboundWebhookTransport(), scheduler: engine.scheduler, store: store,
            limits: .init(perOperation: 1, perQueue: 1, total: 1), newestSeq: { 0 })
        let durability = Durability(engine: engine, idempotency: IdempotencyCache(maxKeys: 1_000, maxBytes: 1 << 20), store: store, retain: 1)
        let instance = InstanceInfo(id: "route-tables", store: "memory", now: Timestamp(nanoseconds: 0))
        let router = buildRouter(
            engine: engine, events: events, metrics: Metrics(), webhooks: webhooks, external: ExternalKind(), durability: durability,
            store: store, lifecycle: Lifecycle(), limits: OpqdConfiguration.Limits(), access: Access(token: token, readToken: nil), maxBody: 1 << 20,
            instance: instance, serverID: "route-tables", placement: SingleInstance(instance: instance))
        return (router, engine)
    }

    static func followerReads() -> Router {
        var router = Router()
        let pool = PGReadPool(url: "postgresql://nobody@127.0.0.1:1/none")
        FollowerReads(reads: PostgresOperationReads(pool: pool), queues: PostgresQueueReads(pool: pool), limits: OpqdConfiguration.Limits())
            .addRoutes(to: &router)
        return router
    }
}

/// Every route says which queues it touches (`RouteScope`), and a cluster routes by it
/// (`ClusterFront`): a route that says the wrong thing runs on the wrong instance.
@Suite("Every route's scope (the table a cluster routes by)")
struct RouteScopeTests {
    /// What each route of the API touches, by its metrics label. A route added without an entry
    /// here fails `everyRouteHasTheScopeItsEntrySays`: decide where a cluster answers it.
    static let expected: [String: String] = [
        "GET /": "instance",
        "GET /dashboard.css": "instance",
        "GET /dashboard.js": "instance",
        "GET /healthz": "instance",
        "GET /readyz": "instance",
        "GET /metrics": "instance",
        "GET /openapi.yaml": "instance",
        "GET /v1/access": "instance",
        "GET /v1/cluster": "instance",
        // Between instances: a partitioned instance's front answers it before the table.
        "POST /v1/cluster/relay": "instance",
        "GET /v1/events": "instance",
        "GET /v1/events/stream": "instance",
        // This instance's leases only, in a cluster too (see the report of issue 23).
        "GET /v1/workers": "every instance, merged",
        // Limiters: this instance's engine (one budget per cluster is issue 25's open part).
        "POST /v1/limiters": "instance",
        "GET /v1/limiters": "instance",
        "GET /v1/limiters/{name}": "instance",
        "PATCH /v1/limiters/{name}": "instance",
        "DELETE /v1/limiters/{name}": "instance",
        "GET /v1/limiters/{name}/keys": "instance",
        // Hosts: this instance's engine; one state per host across instances comes through
        // the shared store and the feed (README "Hosts and a cluster").
        "GET /v1/hosts": "instance",
        "GET /v1/hosts/{host}": "instance",
        "PATCH /v1/hosts/{host}": "instance",
        // Schedules: their queue's holder; the list over all queues, every instance's merged.
        "POST /v1/queues/{name}/schedules": "queue {name}",
        "GET /v1/queues/{name}/schedules": "queue {name}",
        "GET /v1/queues/{name}/schedules/{schedule}": "queue {name}",
        "PATCH /v1/queues/{name}/schedules/{schedule}": "queue {name}",
        "DELETE /v1/queues/{name}/schedules/{schedule}": "queue {name}",
        "GET /v1/queues/{name}/schedules/{schedule}/next": "queue {name}",
        "POST /v1/queues/{name}/schedules/{schedule}/pause": "queue {name}",
        "POST /v1/queues/{name}/schedules/{schedule}/resume": "queue {name}",
        "POST /v1/queues/{name}/schedules/{schedule}/trigger": "queue {name}",
        "POST /v1/queues/{name}/schedules/{schedule}/backfill": "queue {name}",
        "GET /v1/schedules": "every instance, merged",
        "GET /v1/queues/{name}/history": "queue {name}",
        "GET /v1/history": "every instance, merged",

        "GET /v1/queues": "every queue, from the store",
        "POST /v1/queues": "queue in body.name",
        "GET /v1/queues/{name}": "queue {name}, from the store",
        "PATCH /v1/queues/{name}": "queue {name}",
        "DELETE /v1/queues/{name}": "queue {name}",
        "POST /v1/queues/{name}/suspend": "queue {name}",
        "POST /v1/queues/{name}/resume": "queue {name}",
        "POST /v1/queues/{name}/cancel-all": "queue {name}",
        "GET /v1/queues/{name}/wait": "queue {name}",
        "POST /v1/queues/{name}/barrier": "queue {name}",
        "POST /v1/queues/{name}/operations": "queue {name}",
        "GET /v1/queues/{name}/operations": "queue {name}",
        "POST /v1/queues/{name}/operations:cancel": "queue {name}",
        "POST /v1/queues/{name}/claim": "queue {name}",
        "GET /v1/queues/{name}/archive": "queue {name}",
        "POST /v1/queues/{name}/archive": "queue {name}",
        "POST /v1/queues/{name}/observers": "queue {name}",
        "GET /v1/queues/{name}/observers": "queue {name}",
        "GET /v1/queues/{name}/observers/{observer}": "queue {name}",
        "DELETE /v1/queues/{name}/observers/{observer}": "queue {name}",

        "GET /v1/operations/{id}": "operation {id}, from the store",
        "PATCH /v1/operations/{id}": "operation {id}",
        "POST /v1/operations/{id}/cancel": "operation {id}",
        "POST /v1/operations/{id}/pause": "operation {id}",
        "POST /v1/operations/{id}/resume": "operation {id}",
        "GET /v1/operations/{id}/events": "operation {id}, from the store",
        "GET /v1/operations/{id}/wait": "operation {id}",
        "POST /v1/operations/{id}/copy": "operation {id}, into body.queue",
        "POST /v1/operations/{id}/heartbeat": "operation {id}",
        "POST /v1/operations/{id}/progress": "operation {id}",
        "POST /v1/operations/{id}/finish": "operation {id}",
        "POST /v1/operations/{id}/observers": "operation {id}",
        "GET /v1/operations/{id}/observers": "operation {id}",
        "GET /v1/operations/{id}/observers/{observer}": "operation {id}",
        "DELETE /v1/operations/{id}/observers/{observer}": "operation {id}",
        "POST /v1/operations:batch": "queues in body.operations[].queue",
        "POST /v1/operations:finish": "operations in body.finishes[].id, split",
    ]

    /// A scope in words, its path parameter by the name the pattern gives it ("?" when the
    /// pattern has no such parameter).
    static func describe(_ route: Router.Route) -> String {
        let names = route.pattern.split(separator: "/").filter { $0.hasPrefix("{") }.map(String.init)
        func param(_ i: Int) -> String { i >= 0 && i < names.count ? names[i] : "?" }
        func reads(_ r: RouteScope.Reads) -> String { r == .fromStore ? ", from the store" : "" }
        switch route.scope {
        case .instance: return "instance"
        case .everyInstance: return "every instance, merged"
        case .everyQueue: return "every queue, from the store"
        case let .queue(p, r): return "queue \(param(p))" + reads(r)
        case let .operation(p, r, into): return "operation \(param(p))" + reads(r) + (into.map { ", into body.\($0)" } ?? "")
        case let .queueInBody(member): return "queue in body.\(member)"
        case let .queuesInBody(list, member, _): return "queues in body.\(list)[].\(member)"
        case let .operationsInBody(list, member, _): return "operations in body.\(list)[].\(member), split"
        }
    }

    @Test func everyRouteHasTheScopeItsEntrySays() {
        let routes = RouteTables.api().routes
        #expect(routes.count >= 49, "the table is not the whole API: \(routes.count) routes")
        for route in routes {
            guard let want = Self.expected[route.label] else {
                Issue.record("\(route.label) has no entry in RouteScopeTests.expected: say which queues it touches (now \(Self.describe(route)))")
                continue
            }
            #expect(Self.describe(route) == want, "\(route.label)")
        }
        let labels = Set(routes.map(\.label))
        for label in Self.expected.keys where !labels.contains(label) { Issue.record("\(label) is expected but no longer a route") }
        #expect(labels.count == routes.count, "a route is added twice")
    }

    /// The rules the table follows, so that a new entry cannot contradict them either.
    @Test func aRouteUnderAQueueOrAnOperationIsScopedByItsParameter() {
        for route in RouteTables.api().routes {
            let d = Self.describe(route)
            if route.pattern.hasPrefix("/v1/queues/{name}") {
                #expect(d.hasPrefix("queue {name}"), "\(route.label): \(d)")
            } else if route.pattern.hasPrefix("/v1/operations/{id}") {
                #expect(d.hasPrefix("operation {id}"), "\(route.label): \(d)")
            } else if route.pattern.hasPrefix("/v1/limiters/{name}") {
                // A limiter is no queue: answered by this instance's engine (issue 25's cluster part).
                #expect(d == "instance", "\(route.label): \(d)")
            } else if route.pattern.hasPrefix("/v1/hosts/{host}") {
                // A host is no queue either: every instance's engine tracks it.
                #expect(d == "instance", "\(route.label): \(d)")
            } else if route.pattern.contains("{") {
                Issue.record("\(route.label): a parameter outside /v1/queues/{name} and /v1/operations/{id}; give it a rule here")
            } else if route.pattern.hasPrefix("/v1/queues") || route.pattern.hasPrefix("/v1/operations") {
                #expect(d != "instance", "\(route.label) touches queues but says it touches none")
            }
            #expect(!d.contains("?"), "\(route.label) names a parameter its pattern lacks: \(d)")
        }
    }

    /// A read answered from the store is one `FollowerReads` answers, with the same scope, and
    /// the other way round: the two tables cannot drift apart.
    @Test func readsFromTheStoreAreExactlyTheFollowerReads() {
        let api = RouteTables.api().routes
        let follower = RouteTables.followerReads().routes
        let fromStore = api.filter { Self.describe($0).contains("from the store") }
        #expect(!fromStore.isEmpty)
        #expect(Set(fromStore.map(\.label)) == Set(follower.map(\.label)))
        for route in fromStore { #expect(route.method == "GET", "\(route.label) reads from the store but is not a read") }
        for route in follower {
            let twin = api.first { $0.label == route.label }
            #expect(twin.map(Self.describe) == Self.describe(route), "\(route.label)")
        }
    }
}
