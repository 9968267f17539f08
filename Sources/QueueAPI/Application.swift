import Dispatch
import Logging
import MicroHTTP
import QueueEngine
import QueueKinds
import QueueStore
import Locking
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

enum System {
    static var coreCount: Int { Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))) }
}

/// The running service: engine, HTTP server, change feed, metrics.
public final class OpqdApplication: Sendable {
    public let configuration: OpqdConfiguration
    public let engine: QueueEngine
    let server: HTTPServer
    let events: EventLog
    let metrics: Metrics
    let idempotency: IdempotencyCache
    let webhooks: Webhooks
    let external: ExternalKind
    let kindsConfiguration: KindsConfiguration
    /// The durable store, or nil with `--store memory`.
    let sqlite: SQLiteStore?
    let logger: Logger
    let stopping = Atomic<Bool>(false)
    private let timers = TimerBox()
    /// The router and the application for the server's handler; emptied at shutdown, which
    /// breaks the reference cycle app -> server -> handler -> router -> app.
    private let box: RouterBox

    init(configuration: OpqdConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let limits = configuration.limits
        let sqlite: SQLiteStore? = configuration.store == "sqlite"
            ? try SQLiteStore(directory: configuration.data, sync: SyncMode(rawValue: configuration.sync) ?? .full)
            : nil
        self.sqlite = sqlite
        var recovered = try sqlite?.load()
        if let sqlite, var r = recovered {
            r.poisoned = Self.countUncleanStops(sqlite, r, logger: logger)
            recovered = r
        }
        let kindsConfiguration = KindsConfiguration(allowCommands: configuration.allowCommands, maxCommands: limits.commands)
        self.kindsConfiguration = kindsConfiguration
        let external = ExternalKind()
        self.external = external
        var kinds = standardKinds(kindsConfiguration)
        kinds["external"] = external
        self.engine = QueueEngine(
            kinds: kinds, store: sqlite ?? InMemoryStore(),
            configuration: EngineConfiguration(
                defaultMaxConcurrentOperationCount: configuration.defaultMaxConcurrent,
                maxUnfinishedOperations: limits.unfinished, maxQueues: limits.queues,
                maxUnfinishedPerQueue: limits.unfinishedPerQueue, maxDependencies: limits.dependencies))
        let kept = Self.contiguousTail(sqlite?.recentEvents(limit: configuration.eventCapacity) ?? [],
                                       lastSeq: recovered?.lastSeq ?? 0)
        self.events = EventLog(capacity: configuration.eventCapacity,
                               startingAfter: (kept.first?.seq ?? ((recovered?.lastSeq ?? 0) + 1)) - 1,
                               maxBacklog: limits.sseBacklog)
        events.append(kept)
        self.metrics = Metrics()
        self.idempotency = IdempotencyCache(maxKeys: limits.idempotencyKeys, maxBytes: limits.idempotencyBytes)
        self.webhooks = Webhooks(logger: logger, transport: OutboundWebhookTransport(), store: sqlite,
                                 limits: .init(perOperation: limits.observersPerOperation, perQueue: limits.observersPerQueue, total: limits.observers))
        let serverConfig = HTTPServerConfiguration(
            host: configuration.host, port: configuration.port, threads: configuration.threads,
            maxBodyBytes: configuration.maxBody, connectionTimeout: configuration.connectionTimeout,
            connectionLimit: configuration.connectionLimit, listenBacklog: 1024, maxHeaderBytes: limits.headerBytes)
        // The router is complete before the server exists; its handlers reach the application
        // through `box`, filled in below, before anything listens.
        let box = RouterBox()
        self.box = box
        let log = logger
        let metrics = self.metrics
        self.server = HTTPServer(configuration: serverConfig, handler: { request in
            box.handle(request)
        }, log: { level, message in
            log.log(level: Logger.Level(rawValue: level) ?? .error, "\(message)", metadata: ["component": "http"])
        }, responseObserver: { status in
            metrics.countRequest(status: status)
        }, headCheck: { head in
            box.refusal(head)
        })
        var router = Router()
        Routes(app: self).register(in: &router)
        WorkerRoutes(app: self).register(in: &router)
        box.set(router: router, app: self)
        let (events, webhooks) = (self.events, self.webhooks)
        _ = engine.observeAll { batch in metrics.observe(batch) }
        // Clients are shown only committed changes: a seq once shown always names the same event.
        engine.observeDurable { batch in
            events.append(batch)
            webhooks.deliver(batch)
        }
        if let sqlite {
            idempotency.preload(sqlite.loadIdempotency().map {
                ($0.scope, $0.bodyHash, HTTPResponse(status: $0.status, headers: $0.headers, body: $0.body), $0.createdAt)
            })
        }
        if let recovered {
            engine.restore(recovered)
            logger.info("store recovered", metadata: [
                "path": "\(sqlite?.path ?? "")", "queues": "\(recovered.queues.count)",
                "operations": "\(recovered.operations.count)", "lastSeq": "\(recovered.lastSeq)",
                "poisoned": "\(recovered.poisoned.count)",
            ])
        }
    }

    /// The stored events the feed starts with: the newest run of consecutive seqs ending at the
    /// last seq ever given out. The feed finds events by their offset in one gap-free run, and
    /// events of purged operations or deleted queues leave gaps in the store: a cursor before a
    /// gap gets 410, which is true (events after it are no longer all kept).
    static func contiguousTail(_ events: [ChangeEvent], lastSeq: UInt64) -> [ChangeEvent] {
        guard let last = events.last, last.seq == lastSeq else { return [] }
        var i = events.count - 1
        while i > 0 && events[i - 1].seq &+ 1 == events[i].seq { i -= 1 }
        return Array(events[i...])
    }

    /// Poison operations (API.md "Crashes"): counts, per operation, the unclean stops in a row
    /// it was executing during, durably before anything runs again. A clean stop (`shutdown`)
    /// leaves a marker and clears the counts. Returns those that reached 3.
    static func countUncleanStops(_ store: SQLiteStore, _ recovered: RecoveredState, logger: Logger) -> Set<OperationID> {
        let clean = store.meta(prefix: "clean_stop").contains { $0.key == "clean_stop" && $0.value == "1" }
        var counts: [String: Int] = [:]
        for (key, value) in store.meta(prefix: "crashes:") { counts[key] = Int(value) ?? 0 }
        var writes: [(key: String, value: String?)] = [("clean_stop", nil)]
        var poisoned: Set<OperationID> = []
        if !clean {
            var executing: Set<String> = []
            for op in recovered.operations where op.state == .executing {
                let key = "crashes:\(op.id)"
                executing.insert(key)
                let n = min((counts[key] ?? 0) + 1, 1_000)
                writes.append((key, String(n)))
                if n >= 3 { poisoned.insert(op.id) }
            }
            // "In a row": an operation that was not executing during this crash starts over.
            for key in counts.keys where !executing.contains(key) { writes.append((key, nil)) }
            if !executing.isEmpty { logger.warning("the last stop was not clean", metadata: ["executing": "\(executing.count)"]) }
        }
        let committed = DispatchSemaphore(value: 0)
        if store.setMeta(writes, then: { committed.signal() }) { committed.wait() }
        return poisoned
    }
    /// The bound port (after `start`).
    public var port: Int { server.port }

    /// Binds and serves.
    public func start() throws {
        try server.start()
        let purge = DispatchSource.makeTimerSource(queue: .global())
        purge.schedule(deadline: .now() + 5, repeating: 5)
        let (engine, retain, sqlite, webhooks) = (self.engine, configuration.retain, self.sqlite, self.webhooks)
        purge.setEventHandler {
            // Small batches, so neither the engine's lock nor the writer is held for long.
            let cutoff = SystemClock().now().adding(seconds: -retain)
            var purged = 0
            while true {
                let n = engine.purgeFinished(before: cutoff, limit: 1000)
                purged += n
                if n < 1000 { break }
            }
            if webhooks.count > 0 {
                webhooks.removeOrphans { id in (try? engine.revision(of: id)) != nil }
            }
            if let sqlite {
                while sqlite.purge(finishedBefore: cutoff, limit: 1000) == 1000 {}
                _ = sqlite.purgeIdempotency(before: cutoff)
            }
        }
        purge.resume()
        let heartbeat = DispatchSource.makeTimerSource(queue: .global())
        heartbeat.schedule(deadline: .now() + 1, repeating: 1)
        let ticks = Atomic<Int>(0)
        heartbeat.setEventHandler { [events] in
            events.cutOffStalled()
            if ticks.add(1, ordering: .relaxed).newValue % 15 == 0 { events.heartbeat() }
        }
        heartbeat.resume()
        timers.set([purge, heartbeat])
        if configuration.token == nil && !Self.isLoopback(configuration.host) {
            logger.warning("listening on a non-loopback address without a token: anyone who can reach \(configuration.host):\(port) can create, cancel and delete queues and operations, and run what --allow-command allows; set --token (OPQD_TOKEN)")
        }
        logger.info("opqd serving", metadata: ["host": "\(configuration.host)", "port": "\(port)", "threads": "\(configuration.threads)"])
    }

    /// Graceful stop: no new connections, long polls and streams answered, in-flight
    /// requests finished, then the daemon stops.
    public func shutdown() {
        guard !stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        logger.info("opqd stopping")
        timers.cancelAll()
        events.closeStreams()
        server.shutdown(timeout: .seconds(8))
        box.clear()
        if let sqlite {
            // A clean stop: operations executing now were not part of a crash. One job, so the
            // counts never go without the marker that explains why.
            var writes: [(key: String, value: String?)] = sqlite.meta(prefix: "crashes:").map { ($0.key, nil) }
            writes.append(("clean_stop", "1"))
            sqlite.setMeta(writes)
            sqlite.close()
        }
        logger.info("opqd stopped")
    }
}

/// The background timers of a running application.
final class TimerBox: @unchecked Sendable {
    private let lock = Lock<Void>(())
    private var timers: [DispatchSourceTimer] = []
    func set(_ t: [DispatchSourceTimer]) { lock.withLock { _ in timers = t } }
    func cancelAll() { lock.withLock { _ in for t in timers { t.cancel() }; timers = [] } }
}

/// Holds the router once the application exists.
final class RouterBox: Sendable {
    private let cached = AtomicLazyRouter()

    func set(router: Router, app: OpqdApplication) {
        cached.store(router: router, app: app)
    }

    func clear() { cached.clear() }

    /// The target and token checks of `dispatch`, on the head alone (before the body is read).
    func refusal(_ head: HTTPRequest) -> HTTPResponse? {
        guard let (router, app) = cached.load() else { return nil }
        return app.refusal(head, match: router.match(method: head.method, path: head.path))
    }

    func handle(_ request: HTTPRequest) -> HTTPHandlerResult {
        guard let (router, app) = cached.load() else {
            return .response(Problem(503, "starting", "Starting", "the server is starting").response)
        }
        return app.dispatch(request, router: router)
    }
}

/// Set once before the server starts; read without a lock afterwards.
final class AtomicLazyRouter: @unchecked Sendable {
    private var value: (Router, OpqdApplication)?
    private let ready = Atomic<Bool>(false)
    func store(router: Router, app: OpqdApplication) {
        value = (router, app)
        ready.store(true, ordering: .releasing)
    }
    func load() -> (Router, OpqdApplication)? {
        ready.load(ordering: .acquiring) ? value : nil
    }
    /// After the server has stopped (no handler runs any more).
    func clear() {
        ready.store(false, ordering: .releasing)
        value = nil
    }
}

extension OpqdApplication {
    static func isLoopback(_ host: String) -> Bool {
        host.hasPrefix("127.") || host == "localhost" || host == "::1"
    }

    /// The credentials a request presents, compared in constant time.
    enum Credential { case none, full, read }

    func credential(_ request: HTTPRequest) -> Credential {
        guard let token = configuration.token else { return .full }
        guard let presented = Self.bearer(request) else { return .none }
        // Both comparisons always run, so the time taken says nothing about which matched.
        let full = Self.constantTimeEquals(presented, Array(token.utf8))
        let read = configuration.readToken.map { Self.constantTimeEquals(presented, Array($0.utf8)) } ?? false
        return full ? .full : read ? .read : .none
    }

    /// The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 7235).
    static func bearer(_ request: HTTPRequest) -> ArraySlice<UInt8>? {
        guard let header = request.header("authorization") else { return nil }
        let bytes = Array(header.utf8)
        guard bytes.count > 7 else { return nil }
        let scheme = bytes[0..<6].map { $0 | 0x20 }
        guard scheme == Array("bearer".utf8), bytes[6] == 0x20 else { return nil }
        var token = bytes[7...]
        while token.first == 0x20 { token = token.dropFirst() }
        while token.last == 0x20 || token.last == 0x09 { token = token.dropLast() }
        return token.isEmpty ? nil : token
    }

    /// True when equal; the time depends only on the length of `expected`.
    static func constantTimeEquals(_ given: ArraySlice<UInt8>, _ expected: [UInt8]) -> Bool {
        var diff = UInt(bitPattern: given.count ^ expected.count)
        let base = given.startIndex
        for i in 0..<expected.count {
            let g: UInt8 = i < given.count ? given[base + i] : 0
            diff |= UInt(g ^ expected[i])
        }
        return diff == 0
    }

    static let unauthorized = Problem(
        401, "unauthorized", "Unauthorized",
        "this server needs an Authorization: Bearer <token> header (only GET /healthz and GET /readyz are open)",
        headers: [("WWW-Authenticate", "Bearer realm=\"opqd\"")])

    /// 400 for a target that is not an absolute path, 401/403 for a missing, wrong or read-only
    /// token on the route `match` found for it; nil when the request may go on. Run on the head
    /// (before the body is read) and again in `dispatch`.
    /// `match` is evaluated only when a token is configured: without one, the head check costs
    /// no route match.
    func refusal(_ request: HTTPRequest, match: @autoclosure () -> Router.Match) -> HTTPResponse? {
        // `x/v1/queues`, `*`, `http://host/...`: the router must never guess what was meant.
        guard request.path.utf8.first == UInt8(ascii: "/") else {
            return Problem(400, "bad-request-target", "Bad Request",
                           "the request target must be an absolute path such as /v1/queues").response
        }
        guard configuration.token != nil else { return nil }
        // Decided on the route that matched: unknown paths and other methods need a token too,
        // so nothing about the API is told to a caller without one.
        let access: RouteAccess
        switch match() {
        case let .found(_, _, a): access = a
        case .methodNotAllowed(_, open: true): access = .open
        case .methodNotAllowed, .notFound: access = .read
        }
        guard access != .open else { return nil }
        switch credential(request) {
        case .none:
            return Self.unauthorized.response
        case .read where access == .write || !(request.method == "GET" || request.method == "HEAD"):
            return Problem(403, "read-only-token", "Forbidden",
                           "the read-only token may make GET and HEAD requests only; \(request.method) \(request.path) needs the full token").response
        case .read, .full:
            return nil
        }
    }

    func dispatch(_ request: HTTPRequest, router: Router) -> HTTPHandlerResult {
        // One route match serves both the access decision and the handler.
        let match = router.match(method: request.method, path: request.path)
        if let refused = refusal(request, match: match) { return .response(refused) }
        let result: HTTPHandlerResult
        switch match {
        case let .found(handler, params, _):
            do {
                result = try handler(request, params)
            } catch let p as Problem {
                result = .response(p.response)
            } catch let e as EngineError {
                result = .response(e.problem.response)
            } catch {
                logger.error("handler failed", metadata: ["request.id": "\(request.id)", "path": "\(request.path)", "error": "\(error)"])
                result = .response(Problem(500, "internal-error", "Internal Server Error", "the server failed to handle this request (request \(request.id))").response)
            }
        case let .methodNotAllowed(allowed, _):
            result = .response(Problem(405, "method-not-allowed", "Method Not Allowed",
                                       "\(request.method) is not allowed on \(request.path); allowed: \(allowed.joined(separator: ", "))",
                                       headers: [("Allow", allowed.joined(separator: ", "))]).response)
        case .notFound:
            result = .response(Problem.notFound("no route for \(request.path)").response)
        }
        if logger.logLevel <= .debug {
            logger.debug("request", metadata: ["request.id": "\(request.id)", "method": "\(request.method)", "path": "\(request.path)"])
        }
        return result
    }
}

/// Builds the service from its configuration; `opqd` and the tests both call this.
public func buildApplication(configuration: OpqdConfiguration, logger: Logger? = nil) throws -> OpqdApplication {
    var log = logger ?? Logger(label: "opqd")
    log.logLevel = configuration.logLevel
    return try OpqdApplication(configuration: configuration, logger: log)
}
