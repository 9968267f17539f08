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

    init(configuration: OpqdConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let sqlite: SQLiteStore? = configuration.store == "sqlite"
            ? try SQLiteStore(directory: configuration.data, sync: SyncMode(rawValue: configuration.sync) ?? .full)
            : nil
        self.sqlite = sqlite
        let recovered = try sqlite?.load()
        let kindsConfiguration = KindsConfiguration(allowCommands: configuration.allowCommands)
        self.kindsConfiguration = kindsConfiguration
        let external = ExternalKind()
        self.external = external
        var kinds = standardKinds(kindsConfiguration)
        kinds["external"] = external
        self.engine = QueueEngine(
            kinds: kinds, store: sqlite ?? InMemoryStore(),
            configuration: EngineConfiguration(defaultMaxConcurrentOperationCount: configuration.defaultMaxConcurrent))
        let kept = sqlite?.recentEvents(limit: configuration.eventCapacity) ?? []
        self.events = EventLog(capacity: configuration.eventCapacity, startingAfter: (kept.first?.seq ?? ((recovered?.lastSeq ?? 0) + 1)) - 1)
        events.append(kept)
        self.metrics = Metrics()
        self.idempotency = IdempotencyCache(capacity: 100_000)
        self.webhooks = Webhooks(logger: logger)
        var router = Router()
        // The server needs the router, the router's handlers need self: late-bound box.
        let box = RouterBox()
        let serverConfig = HTTPServerConfiguration(
            host: configuration.host, port: configuration.port, threads: configuration.threads,
            maxBodyBytes: configuration.maxBody, connectionTimeout: configuration.connectionTimeout,
            connectionLimit: configuration.connectionLimit, listenBacklog: 1024)
        let log = logger
        self.server = HTTPServer(configuration: serverConfig, handler: { request in
            box.handle(request)
        }, log: { level, message in
            log.log(level: Logger.Level(rawValue: level) ?? .error, "\(message)", metadata: ["component": "http"])
        })
        Routes(app: self).register(in: &router)
        WorkerRoutes(app: self).register(in: &router)
        box.set(router: router, app: self)
        let (events, metrics) = (self.events, self.metrics)
        _ = engine.observeAll { batch in
            events.append(batch)
            metrics.observe(batch)
        }
        if let sqlite {
            idempotency.preload(sqlite.loadIdempotency().map {
                ($0.scope, $0.bodyHash, HTTPResponse(status: $0.status, headers: $0.headers, body: $0.body))
            })
        }
        if let recovered {
            engine.restore(recovered)
            logger.info("store recovered", metadata: [
                "path": "\(sqlite?.path ?? "")", "queues": "\(recovered.queues.count)",
                "operations": "\(recovered.operations.count)", "lastSeq": "\(recovered.lastSeq)",
            ])
        }
    }

    /// The bound port (after `start`).
    public var port: Int { server.port }

    /// Binds and serves.
    public func start() throws {
        try server.start()
        let purge = DispatchSource.makeTimerSource(queue: .global())
        purge.schedule(deadline: .now() + 5, repeating: 5)
        let (engine, retain, sqlite) = (self.engine, configuration.retain, self.sqlite)
        purge.setEventHandler {
            // Small batches, so neither the engine's lock nor the writer is held for long.
            let cutoff = SystemClock().now().adding(seconds: -retain)
            while engine.purgeFinished(before: cutoff, limit: 1000) == 1000 {}
            if let sqlite {
                while sqlite.purge(finishedBefore: cutoff, limit: 1000) == 1000 {}
                _ = sqlite.purgeIdempotency(before: cutoff)
            }
        }
        purge.resume()
        let heartbeat = DispatchSource.makeTimerSource(queue: .global())
        heartbeat.schedule(deadline: .now() + 15, repeating: 15)
        heartbeat.setEventHandler { [events] in events.heartbeat() }
        heartbeat.resume()
        timers.set([purge, heartbeat])
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
        sqlite?.close()
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
}

extension OpqdApplication {
    /// Compares the bearer token in constant time.
    static func authorized(_ request: HTTPRequest, token: String) -> Bool {
        guard let header = request.header("authorization"), header.hasPrefix("Bearer ") else { return false }
        let given = Array(header.utf8.dropFirst(7)), want = Array(token.utf8)
        guard given.count == want.count else { return false }
        var diff: UInt8 = 0
        for (a, b) in zip(given, want) { diff |= a ^ b }
        return diff == 0
    }

    func dispatch(_ request: HTTPRequest, router: Router) -> HTTPHandlerResult {
        if let token = configuration.token, request.path.hasPrefix("/v1/"), !Self.authorized(request, token: token) {
            metrics.countRequest(status: 401)
            return .response(Problem(401, "unauthorized", "Unauthorized",
                                     "this server needs an Authorization: Bearer <token> header on /v1 requests",
                                     headers: [("WWW-Authenticate", "Bearer realm=\"opqd\"")]).response)
        }
        let result: HTTPHandlerResult
        switch router.match(method: request.method, path: request.path) {
        case let .found(handler, params):
            do {
                result = try handler(request, params)
            } catch let p as Problem {
                result = .response(p.response)
            } catch let e as EngineError {
                result = .response(e.problem.response)
            } catch {
                logger.error("handler failed", metadata: ["request.id": "\(request.id)", "path": "\(request.path)", "error": "\(error)"])
                result = .response(Problem(500, "internal", "Internal Server Error", "the server failed to handle this request (request \(request.id))").response)
            }
        case let .methodNotAllowed(allowed):
            result = .response(Problem(405, "method-not-allowed", "Method Not Allowed",
                                       "\(request.method) is not allowed on \(request.path); allowed: \(allowed.joined(separator: ", "))",
                                       headers: [("Allow", allowed.joined(separator: ", "))]).response)
        case .notFound:
            result = .response(Problem.notFound("no route for \(request.path)").response)
        }
        if case let .response(r) = result { metrics.countRequest(status: r.status) } else { metrics.countRequest(status: 200) }
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
