import QueueEngine
import QueueKinds
import StoreKit

/// Every route of the API, each controller holding only what it uses.
package func buildRouter(
    engine: QueueEngine, events: EventLog, metrics: Metrics, webhooks: Webhooks, external: ExternalKind, durability: Durability,
    store: any DurableStore, lifecycle: Lifecycle, limits: OpqdConfiguration.Limits, access: Access, maxBody: Int,
    instance: InstanceInfo, serverID: String, placement: any QueuePlacement
) -> Router {
    var router = Router()
    ServiceController(
        engine: engine, events: events, metrics: metrics, webhooks: webhooks, store: store, lifecycle: lifecycle, placement: placement
    ).addRoutes(
        to: &router)
    QueuesController(engine: engine, durability: durability, webhooks: webhooks, limits: limits).addRoutes(to: &router)
    let operations = OperationsController(engine: engine, durability: durability, events: events, store: store, limits: limits)
    operations.addRoutes(to: &router)
    ArchiveController(
        engine: engine, durability: durability, operations: operations, limits: limits, maxBody: maxBody, serverID: serverID
    ).addRoutes(to: &router)
    LimitersController(engine: engine, durability: durability, limits: limits).addRoutes(to: &router)
    HostsController(engine: engine, durability: durability, limits: limits).addRoutes(to: &router)
    SchedulesController(engine: engine, durability: durability, limits: limits).addRoutes(to: &router)
    HistoryController(engine: engine).addRoutes(to: &router)
    ClusterController(engine: engine, placement: placement).addRoutes(to: &router)
    ObserversController(engine: engine, webhooks: webhooks).addRoutes(to: &router)
    EventsController(events: events, scheduler: engine.scheduler, limits: limits).addRoutes(to: &router)
    WorkersController(engine: engine, external: external, durability: durability, limits: limits).addRoutes(to: &router)
    DashboardController(access: access).addRoutes(to: &router)
    return router
}
